#!/usr/bin/env bash
# ResNet-20 on CIFAR-10, 3 epochs, examples/resnet's recipe (2 workers × 128, lr 0.1 cosine per
# step, momentum 0.9, wd 1e-4): many seeds of spargo and of PyTorch, and PyTorch trained on the
# swapped halves of each framework's draw (data stream × initial weights), to tell a framework
# difference from seed noise (BENCHMARKS.md, "ResNets (issue 10)"). One line per run in
# OUT/results.txt, the runs' full output in OUT/log.txt; scripts/resnet_seed_study.py summarises.
#
#   scripts/resnet_seed_study.sh [OUT]
#
# Environment: DATA (CIFAR-10 binaries; default $SPARGO_DATA/cifar10, docs/data.md), SEEDS (default
# 0…15), SWAP (seeds whose halves are swapped; default 0…7), PAR (runs at once, one core each;
# default nproc), LIMIT (seconds before the queue is stopped; default none), REPLAY (a built
# scripts/replay binary; default: built here with go), PYTHON (default /usr/bin/python3),
# STEPS and EVAL_LIMIT (a smoke test: train the first N steps per epoch, evaluate N images).
# Each run uses one core (GOMAXPROCS=1, one torch thread), so PAR = nproc fills the machine.
# A spargo run on spargo's own draw is exactly examples/resnet -seed S (the replay tool feeds
# the same crops, flips and initial weights); PyTorch on its own draw is exactly
# scripts/torch_vgg_cifar.py --model resnet20 --seed S.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/resnet_seed_study}; mkdir -p "$OUT"
D=${DATA:-${SPARGO_DATA:?set SPARGO_DATA to your data root (docs/data.md), or DATA to the CIFAR-10 directory}/cifar10}
PY=${PYTHON:-/usr/bin/python3}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
if [[ -n ${REPLAY:-} ]]; then cp "$REPLAY" "$W/replay"; else go build -o "$W/replay" ./scripts/replay || exit 1; fi
SEEDS=${SEEDS:-$(seq 0 15)}; SWAP=${SWAP:-$(seq 0 7)}
T0=$(date +%s)
for s in $SEEDS; do
  "$W/replay" -data "$D" -model resnet20 -workers 2 -batch 128 -epochs 3 -seed "$s" \
      -write-stream "$W/S$s.bin" -write-init "$W/S$s.safetensors" >/dev/null || exit 1
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$PY" scripts/torch_replay.py --data "$D" --write "$W/T$s" --seed "$s" \
      --model resnet20 --workers 2 --batch 128 --epochs 3 --threads 1 >/dev/null || exit 1
done
job() { # trainer stream-owner init-owner seed
  local tr=$1 st=$2 in=$3 s=$4 o
  if [[ $tr == spargo ]]; then
    o=$(GOMAXPROCS=1 "$W/replay" -data "$D" -model resnet20 -workers 2 -batch 128 -lr 0.1 -wd 1e-4 \
        -schedule cosine -stream "$W/$st$s.bin" -init "$W/$in$s.safetensors" \
        -steps "${STEPS:-0}" -eval-limit "${EVAL_LIMIT:-0}" 2>&1)
  else
    o=$(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$PY" scripts/torch_replay.py --data "$D" --model resnet20 \
        --workers 2 --batch 128 --lr 0.1 --wd 1e-4 --schedule cosine --threads 1 \
        --stream "$W/$st$s.bin" --init "$W/$in$s.safetensors" \
        --steps "${STEPS:-0}" --eval-limit "${EVAL_LIMIT:-0}" 2>&1)
  fi
  echo "$o" | sed "s/^/$tr $st $in $s: /" >> "$OUT/log.txt"
  echo "$tr stream=$st init=$in seed=$s $(echo "$o" | awk '/^epoch/ {printf "e%s %s %s  ", $2, $4, $6}') t=$(( $(date +%s) - T0 ))s" >> "$OUT/results.txt"
}
export -f job; export W D OUT T0 PY STEPS EVAL_LIMIT
{ # the plain runs of both first, then the swaps
  for s in $SEEDS; do echo "spargo S S $s"; echo "torch T T $s"; done
  for s in $SWAP; do echo "torch S T $s"; echo "torch T S $s"; done
} > "$W/jobs"
if [[ -n ${LIMIT:-} ]]; then to="timeout $LIMIT"; else to=""; fi
$to xargs -P "${PAR:-$(nproc)}" -L 1 bash -c 'job "$@"' _ < "$W/jobs"
"$PY" scripts/resnet_seed_study.py "$OUT/results.txt"
