package hooks

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// The "compress, communicate, decompress" family (GRACE's Compressor / Memory / Communicator):
// a Compressor says what one rank sends and how a receiver reads it back, the error-feedback
// Memory (Residual's Compensate and UpdateDense) keeps what the message missed, and the
// Pattern the compressor implies moves the messages. Compressed puts the three together as
// a comm hook; the hooks dgc, qsgd, terngrad, signsgd, signum, efsignsgd, onebit, randomk,
// threshold, natural and 8bit are each a compressor in a file of their own
// (compress_*.go). SparDL, Ok-Topk, OSP and COVAP are not in the family: their selection is
// interleaved with their rounds.

// Compressor encodes a vector (a bucket's compensated gradient, or one chunk of it for the
// two-stage pattern) into a message of whole 32-bit words and reads messages back.
type Compressor interface {
	// Words is the length in 32-bit words of the message of n elements, or -1 when it
	// depends on the values (a threshold). A compressor whose length depends on the call
	// (DGC's density warm-up) returns its steady-state length; every rank's message of a
	// call must still have the same length.
	Words(n int) int
	// WordsFormula is Words as an expression in n (the hooks' docs and CostFormula).
	WordsFormula() string
	// Summable reports that messages are float32 vectors whose elementwise sum over the
	// ranks decodes to the sum of the ranks' decoded vectors (random-k with shared
	// positions): the pattern is then an all-reduce of the messages.
	Summable() bool
	// Compress appends x's message to msg and returns it. x is not changed.
	Compress(msg []byte, x []float32, c CompressCall) []byte
	// Decompress adds what msg encodes to acc (len(acc) elements), or returns an error
	// naming what is wrong with msg. c is the call of the rank that compressed it.
	Decompress(acc []float32, msg []byte, c CompressCall) error
}

// Preparer is implemented by compressors that transform the local gradient before the error
// feedback adds the residual (DGC's clipping and momentum correction, Signum's momentum).
// v holds the compressor's named vectors of the bucket, saved with the hook's state.
type Preparer interface {
	Prepare(g []float32, v Vectors, c CompressCall)
}

// Finisher is implemented by compressors that update their vectors once the rank's message
// is known: sent is what the message decodes to (DGC's momentum factor masking).
type Finisher interface {
	Finish(sent []float32, v Vectors)
}

// Aggregator is implemented by compressors whose result is not the mean of the decoded
// messages: Aggregate turns sum, the rank-order sum of the P decoded messages, into the
// result (signSGD's majority vote). Without it the result is sum/P.
type Aggregator interface {
	Aggregate(sum []float32, p int)
}

// Pattern is how a compressed hook moves its messages.
type Pattern int

const (
	// AllGathered: every rank all-gathers every rank's message of the whole bucket and adds
	// their decodings in rank order (compressors whose messages cannot be summed: QSGD, the
	// sign methods). Fixed-length messages use one Bruck all-gather; messages whose length
	// depends on the values first all-gather the lengths (P-1 words, a control tag).
	AllGathered Pattern = iota
	// AllReduced: the messages are summed by a ring all-reduce (Summable compressors).
	AllReduced
	// TwoStage is DeepSpeed's compressed all-reduce (1-bit Adam's backend): each rank cuts
	// the bucket into P chunks as the ring does, compresses each chunk and sends chunk j to
	// rank j (P-1 point-to-point rounds); rank j decodes the P messages of its chunk, averages
	// them, adds its server residual, compresses the average again and all-gathers it. Error
	// feedback, when on, acts at both stages: the worker residual keeps what each rank's
	// chunks missed, the server residual what the server's message missed.
	TwoStage
)

// CompressCall is what a compressor may draw on in one call: the hook's seed, the bucket,
// the call's number on the bucket, the rank that compresses and, for the two-stage pattern,
// the chunk (0 otherwise), and the world size.
type CompressCall struct {
	Seed   uint64
	Bucket int
	Call   int64
	Rank   int
	Chunk  int
	Size   int
	// Tensors, when it has two or more entries, are the offsets in the compressed vector at
	// which the bucket's tensors start (Bucket.Offsets, the first 0), for compressors that
	// scale per tensor (efsignsgd); nil for a bucket of one tensor, one that does not list its
	// tensors, and the chunks of the two-stage pattern.
	Tensors []int
}

// segments returns the starts of the parts of a vector of n elements that a compressor scales
// apart, and n last: the call's tensors when perTensor is set and the call has them, else the
// whole vector.
func (c CompressCall) segments(n int, perTensor bool) []int {
	if perTensor && len(c.Tensors) >= 2 && c.Tensors[len(c.Tensors)-1] < n {
		return append(c.Tensors[:len(c.Tensors):len(c.Tensors)], n)
	}
	return []int{0, n}
}

// tensorStarts is b's CompressCall.Tensors.
func tensorStarts(b ddp.Bucket) []int {
	if offs := b.Offsets(); len(offs) >= 2 && offs[0] == 0 {
		return offs
	}
	return nil
}

// Shared returns a generator that every rank seeds alike for this call (random-k's
// positions: what the ranks must agree on).
func (c CompressCall) Shared() *rand.Rand {
	return rand.New(rand.NewPCG(c.Seed, uint64(c.Bucket)<<40^uint64(c.Call)<<8^uint64(c.Chunk)))
}

// Local returns this rank's generator for this call (stochastic rounding): seeded by the
// seed, the bucket, the call, the chunk and the rank, so a rerun draws the same numbers and
// the receivers decode the same message on every rank.
func (c CompressCall) Local() *rand.Rand {
	return rand.New(rand.NewPCG(c.Seed^uint64(c.Rank+1)*0x9e3779b97f4a7c15, uint64(c.Bucket)<<40^uint64(c.Call)<<8^uint64(c.Chunk)))
}

// Compressed is a comm hook made of a Compressor, the error-feedback Memory and the Pattern:
// per bucket on every rank, (1) the compressor prepares the gradient (Preparer), (2) with
// error feedback G = g + ξ (Residual.Compensate), (3) the rank compresses G, (4) ξ = G −
// decode(message) (Residual.UpdateDense: the error feedback is exact, output + new residuals
// = gradients + old residuals summed over the ranks), (5) the pattern moves the messages and
// every rank adds the decodings in rank order, (6) the result is their mean (or the
// compressor's Aggregate). Residuals are in sum units like every sparse hook's.
//
// State (ddp.Stateful): the Memory (residuals, call counters) and the compressor's vectors
// (momenta, the server residuals), under "<hook>.bucket<i>.…" and "<hook>.vec.bucket<i>.…".
// Words per call are Words of the compressor composed with the pattern (CostFormula).
type Compressed struct {
	name string
	// Compressor encodes and decodes the messages.
	Compressor Compressor
	// Pattern moves them.
	Pattern Pattern
	// ErrorFeedback keeps the worker residual ξ (and, for TwoStage, the server residual).
	ErrorFeedback bool
	// Seed seeds the compressor's random numbers (CompressCall).
	Seed uint64
	// Buckets is the hook's bucket plan (ddp.Planner): BucketsModel, one bucket with the
	// whole model compressed after backward, or BucketsDDP or "" for DDP's size-capped
	// buckets, overlapped with backward (the hooks' buckets option; efsignsgd's default is
	// model).
	Buckets string

	mu   sync.Mutex
	mem  *Memory
	vecs *vectorMemory
}

var (
	_ ddp.CommHook = (*Compressed)(nil)
	_ ddp.Stateful = (*Compressed)(nil)
	_ ddp.Planner  = (*Compressed)(nil)
)

// Plan implements ddp.Planner: one bucket with the whole model for Buckets = BucketsModel,
// DDP's own plan otherwise.
func (h *Compressed) Plan(params []*nn.Param) ([][]int, error) {
	if h.Buckets != BucketsModel {
		return nil, nil
	}
	return bucketPlan(h.Buckets, params), nil
}

// NewCompressed returns the hook called name made of c moved by pattern, with error feedback
// when feedback is set. A Summable compressor needs AllReduced and AllReduced a Summable one.
func NewCompressed(name string, c Compressor, pattern Pattern, feedback bool, seed uint64) (*Compressed, error) {
	h := &Compressed{name: name, Compressor: c, Pattern: pattern, ErrorFeedback: feedback, Seed: seed}
	return h, h.check()
}

// Name returns the hook's registered name.
func (h *Compressed) Name() string { return h.name }

func (h *Compressed) check() error {
	switch {
	case h.Compressor == nil:
		return fmt.Errorf("hooks: %s: no compressor", h.name)
	case (h.Pattern == AllReduced) != h.Compressor.Summable():
		return fmt.Errorf("hooks: %s: the all-reduce pattern needs a summable compressor and a summable compressor the all-reduce pattern", h.name)
	case h.Pattern == TwoStage && h.Compressor.Words(0) < 0:
		return fmt.Errorf("hooks: %s: the two-stage pattern needs messages of a fixed length", h.name)
	}
	return nil
}

func (h *Compressed) memory() *Memory { return lazyMemory(&h.mu, &h.mem, h.name) }

func (h *Compressed) vectors() *vectorMemory {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.vecs == nil {
		h.vecs = newVectorMemory(h.name)
	}
	return h.vecs
}

// Run communicates one bucket.
func (h *Compressed) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	out, err := h.call(ctx, g, b)
	return result(h.name, b, out, err)
}

func (h *Compressed) call(ctx context.Context, g comm.Group, b ddp.Bucket) ([]float32, error) {
	st, call, err := beginCall(h.memory(), g, b, h.check, indexable(h.name, b))
	if err != nil {
		return nil, err
	}
	flat := b.Flat()
	vecs, err := h.vectors().bucket(b.Index(), len(flat))
	if err != nil {
		return nil, err
	}
	c := CompressCall{Seed: h.Seed, Bucket: b.Index(), Call: call, Rank: g.Rank(), Size: g.Size(), Tensors: tensorStarts(b)}
	if pr, ok := h.Compressor.(Preparer); ok {
		pr.Prepare(flat, vecs, c)
	}
	if len(flat) == 0 {
		return flat, nil
	}
	if h.ErrorFeedback {
		st.Residual.Compensate(flat)
	}
	switch h.Pattern {
	case AllReduced:
		err = h.allReduced(ctx, g, b.Tag(), flat, st.Residual, vecs, c)
	case TwoStage:
		err = h.twoStage(ctx, g, b.Tag(), flat, st.Residual, vecs, c)
	default:
		err = h.allGathered(ctx, g, b.Tag(), flat, st.Residual, vecs, c)
	}
	return flat, err
}

// compress returns the message of x and keeps the worker's error feedback: ξ = x − what the
// message decodes to, on xi (x's range of the residual; nil without feedback). The
// compressor's Finish sees the decoding too, unless vecs is the zero Vectors.
func (h *Compressed) compress(x []float32, xi Residual, vecs Vectors, c CompressCall) ([]byte, error) {
	msg := h.Compressor.Compress(nil, x, c)
	fin, finishes := h.Compressor.(Finisher)
	finishes = finishes && vecs.m != nil
	if !h.ErrorFeedback && !finishes {
		return msg, nil
	}
	sent := make([]float32, len(x))
	if err := h.Compressor.Decompress(sent, msg, c); err != nil {
		return nil, fmt.Errorf("own message: %w", err)
	}
	if h.ErrorFeedback {
		xi.UpdateDense(x, sent)
	}
	if finishes {
		fin.Finish(sent, vecs)
	}
	return msg, nil
}

// aggregate turns the rank-order sum of the decoded messages into the result.
func (h *Compressed) aggregate(sum []float32, p int) {
	if a, ok := h.Compressor.(Aggregator); ok {
		a.Aggregate(sum, p)
		return
	}
	kernels.Scale(1/float32(p), sum)
}

// decodeAll clears acc and adds the decodings of msgs (rank s's at s) in rank order.
func (h *Compressed) decodeAll(acc []float32, msgs [][]byte, c CompressCall) error {
	clear(acc)
	for s, m := range msgs {
		c.Rank = s
		if err := h.Compressor.Decompress(acc, m, c); err != nil {
			return fmt.Errorf("message of rank %d: %w", s, err)
		}
	}
	return nil
}

// allGathered is the AllGathered pattern on flat = G.
func (h *Compressed) allGathered(ctx context.Context, g comm.Group, tag uint32, flat []float32, xi Residual, vecs Vectors, c CompressCall) error {
	msg, err := h.compress(flat, xi, vecs, c)
	if err != nil {
		return err
	}
	p := g.Size()
	sizes := make([]int, p)
	if h.Compressor.Words(len(flat)) >= 0 {
		for i := range sizes {
			sizes[i] = len(msg)
		}
	} else {
		lens, err := comm.AllGatherBytesSized(ctx, g, tag+compressTagLengths, comm.F32Bytes([]float32{float32(len(msg) / 4)}), uniform(p, 4))
		if err != nil {
			return fmt.Errorf("all-gather of the message lengths: %w", err)
		}
		for s, l := range lens {
			words, err := comm.BytesF32(l)
			if err != nil || len(words) != 1 || words[0] < 0 {
				return fmt.Errorf("rank %d sent a malformed message length", s)
			}
			sizes[s] = 4 * int(words[0])
		}
	}
	all, err := comm.AllGatherBytesSized(ctx, g, tag, msg, sizes)
	if err != nil {
		return fmt.Errorf("all-gather of the messages: %w", err)
	}
	if err := h.decodeAll(flat, all, c); err != nil {
		return err
	}
	h.aggregate(flat, p)
	return nil
}

// allReduced is the AllReduced pattern on flat = G: a ring all-reduce of the messages.
func (h *Compressed) allReduced(ctx context.Context, g comm.Group, tag uint32, flat []float32, xi Residual, vecs Vectors, c CompressCall) error {
	msg, err := h.compress(flat, xi, vecs, c)
	if err != nil {
		return err
	}
	words := make([]float32, len(msg)/4)
	copy(comm.F32Bytes(words), msg)
	if err := comm.AllReduce(ctx, g, tag, words, comm.Ring); err != nil {
		return fmt.Errorf("all-reduce of the messages: %w", err)
	}
	clear(flat)
	if err := h.Compressor.Decompress(flat, comm.F32Bytes(words), c); err != nil {
		return fmt.Errorf("summed message: %w", err)
	}
	h.aggregate(flat, g.Size())
	return nil
}

// twoStage is the TwoStage pattern on flat = G.
func (h *Compressed) twoStage(ctx context.Context, g comm.Group, tag uint32, flat []float32, xi Residual, vecs Vectors, c CompressCall) error {
	p, r := g.Size(), g.Rank()
	c.Tensors = nil // the chunks cut across tensors
	offs := chunkOffsets(len(flat), p)
	chunk := func(v []float32, j int) []float32 { return v[offs[j]:offs[j+1]] }
	msgs := make([][]byte, p)
	for j := range p {
		cj := c
		cj.Chunk = j
		var err error
		var xij Residual
		if h.ErrorFeedback {
			xij = chunk(xi, j)
		}
		if msgs[j], err = h.compress(chunk(flat, j), xij, vecs, cj); err != nil {
			return fmt.Errorf("chunk %d: %w", j, err)
		}
	}
	// Stage 1: chunk j to rank j; every rank's message of chunk r is as long as this rank's.
	in := make([][]byte, p)
	in[r] = msgs[r]
	for s := 1; s < p; s++ {
		to, from := (r+s)%p, (r-s+p)%p
		in[from] = make([]byte, len(msgs[r]))
		n, err := comm.SendRecv(ctx, g, tag, to, msgs[to], from, in[from])
		if err != nil {
			return fmt.Errorf("stage 1, chunk %d to rank %d: %w", to, to, err)
		}
		if n != len(msgs[r]) {
			return fmt.Errorf("stage 1: rank %d sent %d bytes of chunk %d, want %d", from, n, r, len(msgs[r]))
		}
	}
	// The server of chunk r: the mean of the P decodings plus the server residual.
	mine := make([]float32, offs[r+1]-offs[r])
	cs := c
	cs.Chunk = r
	if err := h.decodeAll(mine, in, cs); err != nil {
		return fmt.Errorf("stage 1, chunk %d: %w", r, err)
	}
	kernels.Scale(1/float32(p), mine)
	var server Residual
	if h.ErrorFeedback {
		server = chunk(vecs.Get(serverResidual), r)
		server.Compensate(mine)
	}
	back, err := h.compress(mine, server, Vectors{}, cs) // no Finish: the server's message is not the rank's
	if err != nil {
		return fmt.Errorf("server chunk %d: %w", r, err)
	}
	// Stage 2: all-gather of the servers' messages (each as long as this rank's of its chunk).
	sizes := make([]int, p)
	for j := range p {
		sizes[j] = len(msgs[j])
	}
	all, err := comm.AllGatherBytesSized(ctx, g, tag+compressTagServer, back, sizes)
	if err != nil {
		return fmt.Errorf("stage 2: %w", err)
	}
	clear(flat)
	for j, m := range all {
		cj := c
		cj.Chunk, cj.Rank = j, j
		if err := h.Compressor.Decompress(chunk(flat, j), m, cj); err != nil {
			return fmt.Errorf("stage 2: server message of rank %d: %w", j, err)
		}
	}
	return nil
}

// Tag offsets of the compressed hooks within a bucket's range: the messages on 0.
const (
	compressTagLengths = 1 // AllGathered with value-dependent lengths: the lengths (control)
	compressTagServer  = 2 // TwoStage: the servers' all-gather
)

// serverResidual is the name of TwoStage's server residual among a bucket's Vectors: the
// whole bucket's length, of which each rank uses its own chunk.
const serverResidual = "server_residual"

// chunkOffsets cuts n elements into p chunks as the ring all-reduce does (the first n%p one
// longer): chunk j is [offs[j], offs[j+1]).
func chunkOffsets(n, p int) []int {
	offs := make([]int, p+1)
	for j := range p {
		offs[j+1] = offs[j] + n/p
		if j < n%p {
			offs[j+1]++
		}
	}
	return offs
}

// uniform is p sizes of s.
func uniform(p, s int) []int {
	out := make([]int, p)
	for i := range out {
		out[i] = s
	}
	return out
}

// State returns the Memory's and the vectors' state (ddp.Stateful).
func (h *Compressed) State() (map[string][]float32, error) {
	st, err := h.memory().State()
	if err != nil {
		return nil, err
	}
	h.vectors().saveInto(st)
	return st, nil
}

// LoadState restores State's output (ddp.Stateful).
func (h *Compressed) LoadState(st map[string][]float32) error {
	mem, vecs := h.vectors().split(st)
	if err := h.memory().LoadState(mem); err != nil {
		return err
	}
	return h.vectors().load(vecs)
}

// seedOption is the option of the hooks that draw random numbers.
var seedOption = Option{Name: "seed", Default: "0", Help: "seed of the random draws (the same seed draws the same numbers)"}

// bucketsOption is the option of the hooks that can take the whole model as one bucket
// (Compressed.Buckets).
func bucketsOption(def string) Option {
	return Option{Name: "buckets", Default: def, Help: "model: one bucket with the whole model, compressed after backward | " +
		"ddp: DDP's size-capped buckets, overlapped with backward"}
}

// registerCompressed registers the compressed hook name: build reads its compressor from the
// options; a "seed" option, when the hook has one, becomes the hook's Seed.
func registerCompressed(name, summary string, opts []Option, pattern Pattern, feedback bool, build func(o Values) (Compressor, error)) {
	Register(Spec{Name: name, Summary: summary, Options: opts, New: func(o Values) (ddp.CommHook, error) {
		c, err := build(o)
		if err != nil {
			return nil, err
		}
		var seed int
		if _, ok := o.m[seedOption.Name]; ok {
			if seed, err = o.Int(seedOption.Name); err != nil {
				return nil, err
			}
		}
		h, err := NewCompressed(name, c, pattern, feedback, uint64(seed))
		if err != nil {
			return nil, err
		}
		if _, ok := o.m["buckets"]; ok {
			if h.Buckets, err = o.Enum("buckets", BucketsModel, BucketsDDP); err != nil {
				return nil, err
			}
		}
		return h, nil
	}})
}

// optionError is the error of an option value out of its range.
func optionError(hook, option string, v any, want string) error {
	return fmt.Errorf("hooks: %s: option %s=%v, want %s", hook, option, v, want)
}
