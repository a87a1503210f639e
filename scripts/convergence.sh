#!/usr/bin/env bash
# The hooks' convergence comparison (ALGORITHMS.md §0, issue 11): VGG-11 on the CIFAR-10 copy,
# 4 in-process workers × batch 16, 3 epochs, every hook against dense, one metrics file per
# hook in OUT, then the plots (accuracy and loss against epochs and wall time) in docs/.
#
#   scripts/convergence.sh [OUT]            # runs every hook (about 3–8 min each here), then plots
#   scripts/convergence.sh -plot-only [OUT] # re-plots the metrics already in OUT
#
# OUT defaults to docs/convergence. The runs go one after another (they share the cores, and
# img/s and wall time are only comparable that way). Seeds and flags are the check's.
set -euo pipefail
cd "$(dirname "$0")/.."
plot_only=false
if [[ ${1:-} == -plot-only ]]; then plot_only=true; shift; fi
out=${1:-docs/convergence}
data=${SPARGO_DATA:-../shared/data/cifar10/approx}
hooks=(allreduce fp16 bf16 osp spardl:density=0.01 spardl:density=0.01,teams=2 oktopk:density=0.01
       gaussiank:density=0.01 topka topkdsa gtopk powersgd:rank=4,start_iter=10 lags:density=0.01
       mgs:density=0.01 omgs:density=0.01 covap:interval=2 covap:interval=4 covap:interval=auto)
name() { echo "$1" | sed 's/:/_/g; s/=/-/g; s/,/_/g'; }
mkdir -p "$out"
if ! $plot_only; then
  go build -o "$out/.vgg" ./examples/vgg
  for h in "${hooks[@]}"; do
    echo "== $h" >&2
    "$out/.vgg" -data "$data" -model vgg11 -workers 4 -batch 16 -epochs 3 -lr 0.01 -momentum 0.9 \
      -wd 5e-4 -seed 0 -hook "$h" -progress=false -metrics "$out/$(name "$h").jsonl"
  done
  rm -f "$out/.vgg"
fi
f() { for h in "$@"; do echo "$out/$(name "$h").jsonl"; done; }
plot() { local png=$1; shift; ${SPARGO:-go run ./cmd/spargo} plot -x epochs,time -width 1400 -height 1000 -title "$1" -o "$png" $(f "${@:2}"); }
plot docs/convergence-vgg11-dense.png "VGG-11, 4 workers: dense and near-lossless hooks" allreduce fp16 bf16 osp powersgd:rank=4,start_iter=10
plot docs/convergence-vgg11-sparse.png "VGG-11, 4 workers: sparse hooks at density 0.01 vs dense" allreduce spardl:density=0.01 spardl:density=0.01,teams=2 oktopk:density=0.01 gaussiank:density=0.01 topka topkdsa gtopk
plot docs/convergence-vgg11-layerwise.png "VGG-11, 4 workers: layer-wise (OMGS family) and COVAP vs dense" allreduce lags:density=0.01 mgs:density=0.01 omgs:density=0.01 covap:interval=2 covap:interval=4 covap:interval=auto
