#!/usr/bin/env bash
# CI: the README's test command on a fresh clone, as a new user runs it.
#
# Clones this checkout's HEAD (the committed state, not the working tree)
# into an empty temporary directory, so that no data set lies
# beside it, unsets SPARGO_DATA, points the user cache at an empty directory,
# and runs `go test ./...` there with GOFLAGS=-count=1 (no cached results).
# Works offline: the module cache is the caller's (GOMODCACHE), and tests
# download only from local test servers. Prints the test summary (failed
# packages, skipped tests with their reasons) and how long it took; removes
# the temporary directory on exit. Exit status: that of go test.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && git rev-parse --show-toplevel)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/spargo-fresh-clone.XXXXXX")"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

git clone --quiet "$repo" "$tmp/spargo"
cd "$tmp/spargo"
echo "fresh clone of $(git rev-parse --short HEAD) in $tmp/spargo"

unset SPARGO_DATA
# Nor is this CI to the tests.
unset CI
export GOFLAGS=-count=1
# The caller's module and build caches (offline: no proxy), read before the
# user cache moves: GOCACHE defaults to a directory inside it. Reusing the
# build cache is safe: -count=1 keeps test results from being reused.
GOMODCACHE="$(go env GOMODCACHE)" GOCACHE="$(go env GOCACHE)"
export GOMODCACHE GOCACHE GOPROXY=off
# An empty user cache (on Linux), so that no downloaded data set is found.
export XDG_CACHE_HOME="$tmp/cache"
mkdir -p "$XDG_CACHE_HOME"

start=$(date +%s)
status=0
go test -json ./... >"$tmp/test.json" 2>"$tmp/stderr" || status=$?
elapsed=$(( $(date +%s) - start ))

# Summary from the JSON stream: package results, skipped tests and why.
go run "$repo/.ci/testsummary.go" <"$tmp/test.json" || true
if [ -s "$tmp/stderr" ]; then
	echo "--- go test stderr"
	cat "$tmp/stderr"
fi
echo "fresh clone: go test ./... exit $status in ${elapsed}s"
exit "$status"
