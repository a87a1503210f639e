#!/usr/bin/env bash
# spargo's all-reduce between processes on this machine (shared memory with the vector in ordinary
# memory ("shm") or in comm.AllocShared's buffers ("shm-shared", as DDP's buckets), and TCP) against
# PyTorch gloo, alternated in rounds, one JSON line per measurement (BENCHMARKS.md, "Dense all-reduce
# between processes on one host"). Needs Debian's python3-torch at /usr/bin/python3.
#
#   scripts/bench_allreduce_vs_gloo.sh [ROUNDS] > runs.jsonl      (default 3 rounds)
#   SIZES="4KiB 1MiB 64MiB" PROCS="2 4" ITERS=20 scripts/bench_allreduce_vs_gloo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=$(mktemp -d)/spargo
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./cmd/spargo
bytes() { case $1 in *KiB) echo $((${1%KiB} << 10));; *MiB) echo $((${1%MiB} << 20));; *) echo "$1";; esac; }
for ((round = 1; round <= rounds; round++)); do
  for p in ${PROCS:-2 4}; do
    for size in ${SIZES:-4KiB 1MiB 64MiB}; do
      iters=${ITERS:-20}
      for t in shm shm-shared tcp; do
        buffer=private
        [ "$t" = shm-shared ] && buffer=shared
        echo "{\"round\":$round,\"transport\":\"$t\",\"result\":$("$bin" bench allreduce -n "$size" -workers "$p" -transport "${t%-shared}" -buffer "$buffer" -iters "$iters" -warmup 3 -json)}"
      done
      echo "{\"round\":$round,\"transport\":\"gloo\",\"result\":$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_gloo_allreduce.py --procs "$p" --bytes "$(bytes "$size")" --iters "$iters" --warmup 3 --json)}"
    done
  done
done
