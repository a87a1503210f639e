package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// Options configure Init. The zero value reads everything from the environment.
type Options struct {
	// Flags are command-line values; they come first in detection (see DetectEnv).
	Flags Overrides
	// Secret is the job's shared secret; when empty, SPARGO_SECRET, then the contents of the
	// file named by SPARGO_SECRET_FILE. No secret at all means no authentication.
	Secret []byte
	// Bind is where this rank's data listener binds: "host", "host:port" or ":port" (else
	// SPARGO_BIND). The default binds the address this host uses to reach the master, on a
	// free port. An unspecified host (0.0.0.0, ::) listens everywhere and advertises that
	// address. Its port may not be the store's MASTER_PORT. Rank 0's store listens on all
	// interfaces at MASTER_PORT unless Bind names a host, which it then uses too, or
	// MASTER_ADDR is a loopback address (spargo launch), which it then listens on.
	Bind string
	// Timeout is the peer failure timeout: a peer silent for this long fails the group with
	// an error naming it (else SPARGO_TIMEOUT, a duration such as 90s or seconds; 0 = 30 s).
	Timeout time.Duration
	// RendezvousTimeout bounds reaching the store and waiting for every rank's address
	// (0 = 5 minutes, PyTorch's store default): ranks may start far apart.
	RendezvousTimeout time.Duration
	// ConnectTimeout bounds the set-up of the data connections once every rank has published
	// its address (else SPARGO_CONNECT_TIMEOUT; 0 = the peer failure timeout, Timeout). Every
	// rank is up by then, so a rank that has not connected within it has died or cannot be
	// reached: Init fails naming it.
	ConnectTimeout time.Duration
	// OpTimeout bounds every operation with a peer (else SPARGO_OP_TIMEOUT; 0 = none), over
	// TCP and shared memory: see comm.TCPConfig.OpTimeout. It catches a live rank that is out of step (a different
	// -steps), and must exceed the longest wait of one rank for another (evaluation,
	// checkpoints).
	OpTimeout time.Duration
	// Logf receives notes: rejected connections, peer failures (nil = standard error,
	// prefixed with "rank R: ").
	Logf func(format string, args ...any)
	// Lookup reads environment variables (nil = os.LookupEnv).
	Lookup func(string) (string, bool)
	// NodeTransport connects the ranks that share a node (see DetectNode for how a rank's node
	// is found); nil means shared memory (comm.NewShm). SPARGO_SHM=0 on a node's ranks makes
	// them use TCP whatever this says.
	NodeTransport NodeTransport
}

// Init joins the job this process belongs to and returns its communication group.
//
// It detects the environment (DetectEnv). One process gets comm.NewLocal(1)'s group and no
// network. Otherwise the ranks rendezvous through a TCPStore: torchrun's agent store when
// TORCHELASTIC_USE_AGENT_STORE=True (plain PyTorch protocol, keys under the agent's
// "/worker/attempt_N" prefix), else a StoreServer that rank 0 starts on MASTER_PORT
// (authenticated when there is a secret). Each rank binds its own data listener on a free port
// (see Options.Bind), publishes "host:port" under spargo/<run id>/addr/<rank>, reads everyone
// else's, and connects the full mesh with comm.NewTCP, authenticated with the secret.
//
// Closing the group also closes the store (rank 0's server stays up until then, so late
// readers of the addresses are served). ctx bounds the set-up only; use NotifyContext for
// the training loop.
func Init(ctx context.Context, opts Options) (comm.Group, Env, error) {
	lookup := opts.Lookup
	if lookup == nil {
		lookup = os.LookupEnv
	}
	e := envReader{lookup}
	env, err := DetectEnvFrom(opts.Flags, lookup)
	if err != nil {
		return nil, env, err
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "rank %d: %s\n", env.Rank, fmt.Sprintf(format, args...))
		}
	}
	node, err := DetectNode(env, opts.Flags, lookup)
	if err != nil {
		return nil, env, fmt.Errorf("dist: rank %d of %d (%s): %w", env.Rank, env.WorldSize, env.Source, err)
	}
	if env.WorldSize == 1 {
		groups, err := comm.NewLocal(1)
		if err != nil {
			return nil, env, err
		}
		return groups[0], env, nil
	}
	fail := func(err error) (comm.Group, Env, error) {
		return nil, env, fmt.Errorf("dist: rank %d of %d (%s): %w", env.Rank, env.WorldSize, env.Source, err)
	}
	secret, err := resolveSecret(opts.Secret, e)
	if err != nil {
		return fail(err)
	}
	if len(secret) == 0 {
		why := "no SPARGO_SECRET"
		if v, ok := lookup("SPARGO_SECRET"); ok && strings.TrimSpace(v) == "" {
			why = "SPARGO_SECRET is set but empty, which counts as none"
		}
		logf("warning: %s: the store and the data connections are not authenticated (anyone who can reach them can join or disturb the job)", why)
	}
	timeout, err := durationOption(e, opts.Timeout, "SPARGO_TIMEOUT")
	if err != nil {
		return fail(err)
	}
	connectTimeout, err := durationOption(e, opts.ConnectTimeout, "SPARGO_CONNECT_TIMEOUT")
	if err != nil {
		return fail(err)
	}
	if connectTimeout <= 0 {
		connectTimeout = cmp.Or(timeout, defaultPeerTimeout)
	}
	opTimeout, err := durationOption(e, opts.OpTimeout, "SPARGO_OP_TIMEOUT")
	if err != nil {
		return fail(err)
	}
	bind := opts.Bind
	if bind == "" {
		bind, _ = e.get("SPARGO_BIND")
	}
	bindHost, bindPort, err := splitBind(bind)
	if err != nil {
		return fail(err)
	}
	if bindPort != 0 && bindPort == env.MasterPort {
		return fail(fmt.Errorf("bind address %q uses MASTER_PORT %d, which belongs to the store; pick another port or none", bind, env.MasterPort))
	}
	rdzvTimeout := opts.RendezvousTimeout
	if rdzvTimeout <= 0 {
		rdzvTimeout = DefaultStoreTimeout
	}
	rdzvCtx, cancel := context.WithTimeout(ctx, rdzvTimeout)
	defer cancel()

	master := net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort))
	storeOpts := StoreOptions{Secret: secret, Timeout: rdzvTimeout, Logf: logf}
	var server *StoreServer
	closeStore := func(st *Store) {
		if st != nil {
			st.Close()
		}
		if server != nil {
			server.Close()
		}
	}
	if env.UseAgentStore {
		storeOpts.Secret = nil // torchrun's agent speaks plain PyTorch protocol
	} else if env.Rank == 0 {
		if server, err = NewStoreServer(context.WithoutCancel(ctx), net.JoinHostPort(storeHost(bindHost, env.MasterAddr), strconv.Itoa(env.MasterPort)), storeOpts); err != nil {
			return fail(fmt.Errorf("host the store: %w (is MASTER_PORT %d in use? each job needs its own)", err, env.MasterPort))
		}
	}
	st, err := DialStore(rdzvCtx, master, storeOpts)
	if err != nil {
		closeStore(nil)
		return fail(fmt.Errorf("rendezvous: %w", err))
	}
	if env.UseAgentStore {
		st = st.WithPrefix("/worker/attempt_" + strconv.Itoa(env.RestartCount))
	}
	st = st.WithPrefix("spargo/" + env.RunID)

	// The data listener: on the address that reaches the master unless told otherwise.
	advertise := bindHost
	if ip := net.ParseIP(bindHost); bindHost == "" || (ip != nil && ip.IsUnspecified()) {
		local, err := st.localIP()
		if err != nil {
			closeStore(st)
			return fail(err)
		}
		advertise = local
		if bindHost == "" {
			bindHost = local
		}
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", net.JoinHostPort(bindHost, strconv.Itoa(bindPort)))
	if err != nil {
		closeStore(st)
		return fail(fmt.Errorf("bind the data listener: %w", err))
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if port == env.MasterPort {
		// The kernel handed out MASTER_PORT (free on this host because the store is elsewhere).
		ln.Close()
		closeStore(st)
		return fail(fmt.Errorf("the data listener got MASTER_PORT %d; set SPARGO_BIND to a fixed other port", port))
	}
	addrs, err := exchangeAddrs(rdzvCtx, st, env, net.JoinHostPort(advertise, strconv.Itoa(port)))
	if err != nil {
		ln.Close()
		closeStore(st)
		return fail(err)
	}
	world, err := comm.NewTCP(rdzvCtx, comm.TCPConfig{
		Rank: env.Rank, Size: env.WorldSize, Listener: ln, Addrs: addrs,
		Secret: secret, Timeout: timeout, DialTimeout: connectTimeout, OpTimeout: opTimeout, Logf: logf,
	})
	if err != nil {
		closeStore(st)
		return fail(fmt.Errorf("%w (every rank had published its address, so a rank not connected has exited or cannot be reached; the limit is SPARGO_CONNECT_TIMEOUT, else SPARGO_TIMEOUT)", err))
	}
	top, nodes, err := agreeTopology(rdzvCtx, world, node)
	if err != nil {
		world.Close()
		closeStore(st)
		return fail(err)
	}
	transport := opts.NodeTransport
	if transport == nil {
		transport = sharedMemory
	}
	g, err := joinNodes(rdzvCtx, world, top, nodes, transport, NodeGroupConfig{
		RunID: env.RunID, Attempt: env.RestartCount, Secret: secret,
		Timeout: cmp.Or(timeout, defaultPeerTimeout), OpTimeout: opTimeout, Store: st, Logf: logf,
	})
	// Every rank read all addresses before it could connect, and its node's ranks have
	// connected, so the store has done its job for the others; rank 0 keeps its server for the
	// group's lifetime all the same, so a slow reader is never cut off.
	st.Close()
	if err != nil {
		world.Close()
		closeStore(nil)
		return fail(err)
	}
	if server == nil {
		return g, env, nil
	}
	return &storeOwningGroup{Group: g, server: server}, env, nil
}

// storeHost is where rank 0's store listens: the bind host when one is given; else, when the
// master address is a loopback one (spargo launch, torchrun --standalone), that address, since
// no other machine could reach the master anyway; else every interface.
func storeHost(bindHost, masterAddr string) string {
	if bindHost != "" {
		return bindHost
	}
	if ip := net.ParseIP(masterAddr); (ip != nil && ip.IsLoopback()) || masterAddr == "localhost" {
		return masterAddr
	}
	return ""
}

// defaultPeerTimeout is comm's peer failure timeout when none is set.
const defaultPeerTimeout = 30 * time.Second

// durationOption is v when set, else the environment variable name's duration, else 0.
func durationOption(e envReader, v time.Duration, name string) (time.Duration, error) {
	if v > 0 {
		return v, nil
	}
	if s, ok := e.get(name); ok {
		return parseTimeout(name, s)
	}
	return 0, nil
}

// splitBind parses Options.Bind: "", "host", "host:port", ":port", "[v6]:port".
func splitBind(bind string) (host string, port int, err error) {
	if bind == "" {
		return "", 0, nil
	}
	h, p, splitErr := net.SplitHostPort(bind)
	if splitErr != nil {
		return bind, 0, nil // no port
	}
	if p == "" {
		return h, 0, nil
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bind address %q: bad port", bind)
	}
	return h, port, nil
}

// exchangeAddrs publishes this rank's data address and reads every rank's.
func exchangeAddrs(ctx context.Context, st *Store, env Env, mine string) ([]string, error) {
	key := func(r int) string { return "addr/" + strconv.Itoa(r) }
	if err := st.Set(ctx, key(env.Rank), []byte(mine)); err != nil {
		return nil, fmt.Errorf("rendezvous: publish this rank's address: %w", err)
	}
	addrs := make([]string, env.WorldSize)
	for r := range addrs {
		v, err := st.Get(ctx, key(r))
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("rendezvous: rank %d never published its address (is it running? same MASTER_ADDR:MASTER_PORT and run id?): %w", r, err)
			}
			return nil, fmt.Errorf("rendezvous: read rank %d's address: %w", r, err)
		}
		if _, _, err := net.SplitHostPort(string(v)); err != nil {
			return nil, fmt.Errorf("rendezvous: rank %d published %q, not host:port", r, truncate(v))
		}
		addrs[r] = string(v)
	}
	return addrs, nil
}

// localIP is the local address of the store connection: the one this host uses to reach the
// master, hence a good guess at one the other ranks can reach.
func (s *Store) localIP() (string, error) {
	sc := s.conn
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.c == nil {
		return "", errors.New("rendezvous: store connection lost")
	}
	addr, ok := sc.c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("rendezvous: store connection has local address %v", sc.c.LocalAddr())
	}
	return addr.IP.String(), nil
}

// storeOwningGroup is rank 0's group: closing it also stops the store server.
type storeOwningGroup struct {
	comm.Group
	server *StoreServer
	once   sync.Once
}

// Underlying is the job's group (comm.Underlier): rank 0's collectives must find the transport
// the other ranks' find.
func (g *storeOwningGroup) Underlying() comm.Group { return g.Group }

// Topology is the job's topology (comm.Topologist).
func (g *storeOwningGroup) Topology() comm.Topology { return comm.TopologyOf(g.Group) }

func (g *storeOwningGroup) Close() error {
	err := g.Group.Close()
	g.once.Do(func() { g.server.Close() })
	return err
}
