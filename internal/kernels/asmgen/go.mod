// The avo generator lives in its own module: avo v0.6.0 pulls in
// golang.org/x/tools v0.16.1, which does not compile with Go >= 1.25
// (internal/tokeninternal), so this module raises x/tools without touching
// the root go.mod, and keeps the generator out of `go build ./...`.
module github.com/spargo-dl/spargo/internal/kernels/asmgen

go 1.26

require github.com/mmcloughlin/avo v0.6.0

require (
	golang.org/x/mod v0.30.0 // indirect
	golang.org/x/sync v0.18.0 // indirect
	golang.org/x/tools v0.39.0 // indirect
)
