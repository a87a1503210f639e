package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// Store connections to a server that has a secret start with a mutual HMAC-SHA256
// challenge–response before any TCPStore query:
//
//	server → client  "SPARGO-STORE-AUTH1" (18 bytes), nonceS (32 random bytes)
//	client → server  nonceC (32 random bytes), HMAC(secret, "client" | nonceS | nonceC)
//	server → client  HMAC(secret, "server" | nonceS | nonceC)
//
// The secret never crosses the wire, a recorded exchange cannot be replayed (fresh nonces on
// both sides), and the client learns that the server knows the secret before it sends any
// data. A server closes a connection whose proof is wrong or that does not finish the exchange
// within the handshake timeout; a client refuses a server that does not prove itself.
// The exchange authenticates; it does not encrypt. Run across untrusted networks inside a
// VPN or WireGuard tunnel.
const (
	authMagic    = "SPARGO-STORE-AUTH1"
	authNonceLen = 32
	authMACLen   = sha256.Size

	// DefaultHandshakeTimeout bounds the authentication exchange: a stranger that connects and
	// says nothing is dropped after it.
	DefaultHandshakeTimeout = 5 * time.Second
)

// ErrAuth is returned (wrapped) when a store connection fails authentication.
var ErrAuth = errors.New("dist: authentication failed")

// errClosedBeforeChallenge: the server closed the connection before its challenge, as it does
// when too many connections are authenticating. Dialers retry it like a refused connection.
var errClosedBeforeChallenge = errors.New("the server closed the connection before its challenge (busy?)")

func authMAC(secret []byte, role string, nonceS, nonceC []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(role))
	m.Write(nonceS)
	m.Write(nonceC)
	return m.Sum(nil)
}

// serverAuth runs the server's side of the exchange on conn, which must have a deadline set.
func serverAuth(conn net.Conn, secret []byte) error {
	nonceS := make([]byte, authNonceLen)
	if _, err := rand.Read(nonceS); err != nil {
		return fmt.Errorf("generate nonce: %w", err)
	}
	if _, err := conn.Write(append([]byte(authMagic), nonceS...)); err != nil {
		return fmt.Errorf("send challenge: %w", err)
	}
	reply := make([]byte, authNonceLen+authMACLen)
	if _, err := io.ReadFull(conn, reply); err != nil {
		return fmt.Errorf("%w: no complete answer to the challenge: %v", ErrAuth, err)
	}
	nonceC, mac := reply[:authNonceLen], reply[authNonceLen:]
	if !hmac.Equal(mac, authMAC(secret, "client", nonceS, nonceC)) {
		return fmt.Errorf("%w: wrong proof (the client has another secret, or none)", ErrAuth)
	}
	if _, err := conn.Write(authMAC(secret, "server", nonceS, nonceC)); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	return nil
}

// clientAuth runs the client's side of the exchange on conn, which must have a deadline set.
func clientAuth(conn net.Conn, secret []byte) error {
	hello := make([]byte, len(authMagic)+authNonceLen)
	if n, err := io.ReadFull(conn, hello); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return errClosedBeforeChallenge
		}
		return fmt.Errorf("%w: no challenge from the server (does it have a secret?): %v", ErrAuth, err)
	}
	if string(hello[:len(authMagic)]) != authMagic {
		return fmt.Errorf("%w: the server sent no spargo challenge (a PyTorch store, or one without a secret?)", ErrAuth)
	}
	nonceS := hello[len(authMagic):]
	nonceC := make([]byte, authNonceLen)
	if _, err := rand.Read(nonceC); err != nil {
		return fmt.Errorf("generate nonce: %w", err)
	}
	if _, err := conn.Write(append(nonceC, authMAC(secret, "client", nonceS, nonceC)...)); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	proof := make([]byte, authMACLen)
	if _, err := io.ReadFull(conn, proof); err != nil {
		return fmt.Errorf("%w: the server rejected our proof (another secret?): %v", ErrAuth, err)
	}
	if !hmac.Equal(proof, authMAC(secret, "server", nonceS, nonceC)) {
		return fmt.Errorf("%w: the server's proof is wrong", ErrAuth)
	}
	return nil
}
