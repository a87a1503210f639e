package cluster

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxSecretFileBytes bounds what a secret file may hold: a secret is a few dozen bytes, and
// a huge file named by mistake should be an error.
const maxSecretFileBytes = 64 << 10

// resolveSecret picks the job's shared secret: the option, else SPARGO_SECRET, else the
// contents of SPARGO_SECRET_FILE (without trailing white space). None of them: no secret.
func resolveSecret(opt []byte, e envReader) ([]byte, error) {
	if len(opt) > 0 {
		return opt, nil
	}
	if v, ok := e.get("SPARGO_SECRET"); ok {
		return []byte(v), nil
	}
	if path, ok := e.get("SPARGO_SECRET_FILE"); ok {
		s, err := readSecretFile(path)
		if err != nil {
			return nil, fmt.Errorf("SPARGO_SECRET_FILE: %w", err)
		}
		return s, nil
	}
	return nil, nil
}

// readSecretFile reads a secret file and refuses an empty or oversized one.
func readSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("secret file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("secret file: %w", err)
	}
	if len(b) > maxSecretFileBytes {
		return nil, fmt.Errorf("secret file %s is larger than %d bytes", path, maxSecretFileBytes)
	}
	s := bytes.TrimRight(b, " \t\r\n")
	if len(s) == 0 {
		return nil, fmt.Errorf("secret file %s is empty", path)
	}
	return s, nil
}

// parseTimeout reads SPARGO_TIMEOUT-style values: a Go duration ("90s", "2m") or a number of
// seconds ("90", "1.5").
func parseTimeout(name, v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 && s < 1e9 {
		return time.Duration(s * float64(time.Second)), nil
	}
	return 0, fmt.Errorf("%s=%q is not a positive duration (such as 30s, 2m or 45)", name, v)
}
