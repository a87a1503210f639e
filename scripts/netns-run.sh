#!/usr/bin/env bash
# netns-run.sh — run one spargo job with one rank per network namespace of netns-cluster.sh.
#
#   sudo scripts/netns-run.sh P OUTDIR PROGRAM [ARGS...]
#
# Rank r runs PROGRAM ARGS in namespace spargo<r> with the launcher environment spargo's
# dist.Init reads (RANK, WORLD_SIZE, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, MASTER_ADDR=10.77.0.1,
# MASTER_PORT=29500, SPARGO_TIMEOUT, default 300s, and a random SPARGO_SECRET for the job), in
# the current directory. Its stdout and stderr go to OUTDIR/rank<r>.out and .err. The script
# waits for every rank and exits non-zero, naming the ranks, if any failed. Ranks start from
# the last, so that rank 0's store comes up last and nobody waits long for it.
#
#   sudo scripts/netns-cluster.sh up 4 200mbit
#   sudo scripts/netns-run.sh 4 /tmp/out ./spargo bench overlap -model vgg16 -json
#   sudo scripts/netns-cluster.sh down
set -euo pipefail

die() { echo "netns-run: $*" >&2; exit 1; }

[ $# -ge 3 ] || die "usage: $0 P OUTDIR PROGRAM [ARGS...]"
p=$1 out=$2
shift 2
[[ $p =~ ^[0-9]+$ ]] && [ "$p" -ge 1 ] || die "P must be a positive number (got '$p')"
[ "$(id -u)" -eq 0 ] || die "must run as root (ip netns exec)"
for ((r = 0; r < p; r++)); do
	ip netns list | grep -qE "^spargo$r( |$)" || die "namespace spargo$r missing: run scripts/netns-cluster.sh up $p RATE first"
done
mkdir -p "$out"
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
pids=()
for ((r = p - 1; r >= 0; r--)); do
	ip netns exec "spargo$r" env RANK=$r WORLD_SIZE=$p LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
		MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 SPARGO_TIMEOUT="${SPARGO_TIMEOUT:-300s}" SPARGO_SECRET="$secret" \
		"$@" >"$out/rank$r.out" 2>"$out/rank$r.err" &
	pids[r]=$!
done
failed=()
for ((r = 0; r < p; r++)); do
	wait "${pids[r]}" || failed+=("$r")
done
[ ${#failed[@]} -eq 0 ] || die "rank(s) ${failed[*]} failed; see $out/rank<r>.err"
