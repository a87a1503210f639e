#!/usr/bin/env bash
# COVAP at its paper's learning rate (issue 24 part 2; BENCHMARKS.md, "COVAP at the paper's
# learning rate"): paired runs on the same seeds, dense all-reduce against covap:interval=2 and 4.
#
#   VGG-11 on CIFAR-10, 4 in-process workers, batch 16 each, 3 epochs, SGD lr 0.001, momentum 0.9,
#   weight decay 5e-4, seeds 0 and 1, evaluated on the first 4000 test images;
#   the PTB LSTM (small), 4 workers, lr 1, clip 5, one epoch, seed 0.
#
# Usage: scripts/covap_lr0001.sh [CIFAR_DIR [PTB_DIR [RESULTS_DIR]]]
#
# CIFAR_DIR and PTB_DIR default to the programs' own search (-data, $SPARGO_DATA, the user
# cache; see docs/data.md). The table in BENCHMARKS.md used the JPEG-degraded CIFAR-10 copy, which
# holds one training batch (10,000 images, 156 steps per epoch). RESULTS_DIR (default
# ./covap-lr0.001) receives one metrics file (.jsonl) and one log (.out) per run.
#
# With 16 or more CPUs the ten runs go in parallel, two threads each (GOMAXPROCS=2; how the table
# was made, about 6 minutes on a 16-core Xeon); with fewer they run one after the other with
# every CPU. Environment: HOOKS (default "allreduce covap:interval=2 covap:interval=4"),
# SEEDS (default "0 1"), EPOCHS (default 3), LSTM_HOOKS (default "allreduce covap:interval=2").
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cifar=${1:-}
ptb=${2:-}
results=$(realpath -m "${3:-covap-lr0.001}")
hooks=${HOOKS:-allreduce covap:interval=2 covap:interval=4}
lstm_hooks=${LSTM_HOOKS:-allreduce covap:interval=2}
seeds=${SEEDS:-0 1}
epochs=${EPOCHS:-3}

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
echo "building examples/vgg and examples/lstm into $bin"
(cd "$root" && go build -o "$bin/vgg" ./examples/vgg && go build -o "$bin/lstm" ./examples/lstm)
mkdir -p "$results"

name() { echo "$1" | sed 's/:/_/g; s/=/-/g; s/,/_/g'; }

runs=()
for s in $seeds; do
	for h in $hooks; do
		runs+=("vgg_$(name "$h")_s$s|$bin/vgg ${cifar:+-data $cifar} -model vgg11 -workers 4 -batch 16 -epochs $epochs -lr 0.001 -momentum 0.9 -wd 5e-4 -eval-limit 4000 -seed $s -hook $h -progress=false -log-every 10")
	done
done
for h in $lstm_hooks; do
	runs+=("lstm_$(name "$h")|$bin/lstm ${ptb:+-data $ptb} -model small -workers 4 -batch 20 -bptt 35 -epochs 1 -lr 1 -clip 5 -seed 0 -hook $h -progress=false -log-every 10")
done

cpus=$(nproc)
start=$(date +%s)
if [ "$cpus" -ge 16 ]; then
	echo "$cpus CPUs: ${#runs[@]} runs in parallel, GOMAXPROCS=2 each"
	pids=()
	for r in "${runs[@]}"; do
		id=${r%%|*}
		# shellcheck disable=SC2086 # the command line is split into words on purpose
		GOMAXPROCS=2 ${r#*|} -metrics "$results/$id.jsonl" >"$results/$id.out" 2>&1 &
		pids+=($!)
	done
	failed=0
	for p in "${pids[@]}"; do wait "$p" || failed=1; done
else
	echo "$cpus CPUs: ${#runs[@]} runs one after the other"
	failed=0
	for r in "${runs[@]}"; do
		id=${r%%|*}
		echo "$id"
		# shellcheck disable=SC2086
		${r#*|} -metrics "$results/$id.jsonl" >"$results/$id.out" 2>&1 || failed=1
	done
fi
echo "done in $(($(date +%s) - start)) s; results in $results"

# The table: test accuracy after each epoch (VGG), validation perplexity (LSTM), and the mean
# train loss over the first 40 steps (the metrics' step records every 10 steps) against dense's.
python3 - "$results" <<'EOF'
import glob, json, os, re, sys
d = sys.argv[1]
def records(f):
    return [json.loads(l) for l in open(f) if l.startswith("{")]
def early(f):  # step records are every 10 steps, numbered across epochs
    ls = [r["loss"] for r in records(f) if "step" in r and "epoch" not in r and r["step"] <= 40]
    return sum(ls) / len(ls) if ls else float("nan")
for f in sorted(glob.glob(os.path.join(d, "*.jsonl"))):
    b = os.path.basename(f)
    dense = os.path.join(d, re.sub(r"^(vgg|lstm)_.*?(_s\d+)?\.jsonl$", r"\1_allreduce\2.jsonl", b))
    ratio = early(f) / early(dense) if os.path.exists(dense) else float("nan")
    ep = [r for r in records(f) if "epoch" in r]
    if b.startswith("vgg"):
        per = "test acc per epoch " + " / ".join(f"{100 * r['test_acc']:.2f}" for r in ep)
    else:
        per = "val ppl per epoch " + " / ".join(f"{r['val_ppl']:.1f}" for r in ep)
    print(f"{b:40s} {per}   mean train loss steps 1-40: {early(f):.4f} ({ratio:.3f}x dense)")
EOF
exit $failed
