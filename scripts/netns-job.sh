#!/usr/bin/env bash
# netns-job.sh — run one job of P ranks across a cluster made by netns-cluster.sh, one rank per
# namespace (or NETNS_RANKS_PER_NODE=L ranks per namespace: ranks r·L … r·L+L−1 in namespace r,
# a "node" of L processes that share memory), each joining through the launcher environment
# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE=L, GROUP_RANK = its namespace's index,
# SPARGO_NODE = its namespace, since the namespaces share the host's name, MASTER_ADDR =
# namespace 0's address, MASTER_PORT, a shared SPARGO_SECRET).
#
#   sudo scripts/netns-job.sh P PROGRAM [ARGS...]
#   e.g. scripts/netns-job.sh 4 /tmp/spargo bench comm -n 14.7M -hook spardl -json
#        NETNS_RANKS_PER_NODE=2 scripts/netns-job.sh 4 /tmp/spargo bench comm -hook hier:spardl -json
#        (2 namespaces × 2 processes: scripts/netns-cluster.sh up 2 RATE)
#
# Rank 0's standard output is this script's; every rank's standard error goes to
# $NETNS_JOB_LOGS/rank<R>.err (default: a new temporary directory, named on failure).
# NETNS_PREFIX and NETNS_SUBNET must be those the cluster was made with (defaults spargo,
# 10.77.0); MASTER_PORT defaults to 29500 and SPARGO_TIMEOUT to 300s. Exits non-zero when any
# rank fails.
set -euo pipefail

PREFIX=${NETNS_PREFIX:-spargo}
SUBNET=${NETNS_SUBNET:-10.77.0}
PORT=${MASTER_PORT:-29500}

die() { echo "netns-job: $*" >&2; exit 1; }

p=${1:-}
[[ $p =~ ^[0-9]+$ ]] && [ "$p" -ge 1 ] || die "usage: $0 P PROGRAM [ARGS...] (P ≥ 1, got '${p}')"
shift
[ $# -ge 1 ] || die "usage: $0 P PROGRAM [ARGS...]"
[ "$(id -u)" -eq 0 ] || die "must run as root (ip netns exec)"
l=${NETNS_RANKS_PER_NODE:-1}
[[ $l =~ ^[0-9]+$ ]] && [ "$l" -ge 1 ] && [ $((p % l)) -eq 0 ] || die "NETNS_RANKS_PER_NODE=$l must be ≥ 1 and divide P=$p"
for ((r = 0; r < p / l; r++)); do
	ip netns list | grep -qE "^$PREFIX$r( |$)" || die "namespace $PREFIX$r missing: scripts/netns-cluster.sh up $((p / l)) RATE (with the same NETNS_PREFIX)"
done
logs=${NETNS_JOB_LOGS:-$(mktemp -d /tmp/netns-job.XXXXXX)}
mkdir -p "$logs"
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

pids=()
# Highest rank first, so that the others are waiting when rank 0 opens the store.
for ((r = p - 1; r >= 0; r--)); do
	ns=$PREFIX$((r / l))
	cmd=(ip netns exec "$ns" env RANK=$r WORLD_SIZE=$p LOCAL_RANK=$((r % l)) LOCAL_WORLD_SIZE=$l
		GROUP_RANK=$((r / l)) SPARGO_NODE="$ns" MASTER_ADDR="$SUBNET.1" MASTER_PORT="$PORT" SPARGO_SECRET="$secret"
		SPARGO_TIMEOUT="${SPARGO_TIMEOUT:-300s}" "$@")
	if [ "$r" -eq 0 ]; then
		"${cmd[@]}" 2>"$logs/rank$r.err" & # this script's stdout, shared (not reopened)
	else
		"${cmd[@]}" >/dev/null 2>"$logs/rank$r.err" &
	fi
	pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
	wait "$pid" || failed=1
done
if [ "$failed" -ne 0 ]; then
	tail -n 5 "$logs"/rank*.err >&2
	die "a rank failed; logs in $logs"
fi
[ -n "${NETNS_JOB_LOGS:-}" ] || rm -rf "$logs"
