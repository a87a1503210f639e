#!/usr/bin/env bash
# The hooks' convergence comparison (docs/ALGORITHMS.md §0, issue 11): every hook against dense,
# one metrics file per hook in OUT, then the plots in docs/ (dense / sparse / layer-wise
# / compressed / sign groups, against epochs and wall time) and OUT/table.md.
#
#   vgg (default): VGG-11 on $SPARGO_DATA/cifar10, 4 in-process workers × batch 16, 3 epochs;
#     accuracy and loss. OUT defaults to docs/convergence; plots docs/convergence-vgg11-*.png
#     (dense, sparse, layerwise, compressed, sign).
#   lstm: LSTM small on $SPARGO_DATA/ptb (Zaremba's 200-unit model), 4 in-process workers × batch 20 ×
#     bptt 35, SGD lr 20, clip 0.25; validation perplexity and training loss. OUT defaults to
#     docs/convergence-lstm; plots docs/convergence-lstm-*.png. By default the full recipe
#     (LSTM_EPOCHS=13 whole epochs, Zaremba's ×0.5 decay after epoch 4, validation on the whole
#     stream at each epoch's end); the environment shortens it:
#       LSTM_EPOCHS=N        epochs (default 13)
#       LSTM_STEPS=N         steps per epoch (default 0: the whole epoch, 331 steps at P=4)
#       LSTM_EVAL_EVERY=N    also validate every N steps (default 0: at epoch ends only)
#       LSTM_EVAL_LIMIT=N    validate on the first N tokens of the validation stream (0: all)
#       LSTM_SEED=N          seed of the initial weights (default 0)
#     BENCHMARKS.md's run was the shortened one
#       LSTM_EPOCHS=1 LSTM_STEPS=200 LSTM_EVAL_EVERY=25 LSTM_EVAL_LIMIT=20000 scripts/convergence.sh lstm
#
#   scripts/convergence.sh [vgg|lstm] [OUT]            # runs every hook, then plots (into
#                                                      # docs/ for the default OUT, else OUT)
#   scripts/convergence.sh [vgg|lstm] -plot-only [OUT] # re-plots the metrics already in OUT
#   HOOKS="allreduce topka" scripts/convergence.sh lstm  # run only these hooks (the plots take
#                                                        # every hook with a metrics file in OUT)
#
# The runs go one after another (they share the cores, and throughput and wall time are
# only comparable that way). Seeds and flags are the check's; every hook gets the same.
set -euo pipefail
cd "$(dirname "$0")/.."
task=vgg
if [[ ${1:-} == vgg || ${1:-} == lstm ]]; then task=$1; shift; fi
plot_only=false
if [[ ${1:-} == -plot-only ]]; then plot_only=true; shift; fi
if [[ $task == vgg ]]; then out=${1:-docs/convergence}; else out=${1:-docs/convergence-lstm}; fi
# The plots go to docs/ for the default OUT (the committed metrics), into OUT otherwise.
pngs=docs
if [[ -n ${1:-} ]]; then pngs=$out; fi
hooks=(allreduce fp16 bf16 osp spardl:density=0.01 spardl:density=0.01,teams=2 oktopk:density=0.01
       gaussiank:density=0.01 topka topkdsa gtopk powersgd:rank=4,start_iter=10 lags:density=0.01
       mgs:density=0.01 omgs:density=0.01 covap:interval=2 covap:interval=4 covap:interval=auto
       dgc:density=0.001,warmup=100 qsgd terngrad signsgd signum efsignsgd onebit randomk:density=0.01 threshold natural 8bit)
# dgc applies the momentum itself (momentum correction): its runs take the optimizer without momentum.
momentum() { if [[ $1 == dgc* ]]; then echo 0; else echo 0.9; fi; }
run_hooks=(${HOOKS:-${hooks[@]}})
name() { echo "$1" | sed 's/:/_/g; s/=/-/g; s/,/_/g'; }
mkdir -p "$out"
if ! $plot_only; then
  go build -o "$out/.$task" ./examples/$task
  # The machine and the code the runs measure, for the table's heading: one line per
  # invocation, appended when HOOKS re-runs some rows (the others keep their own line).
  line="commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with local changes)'),"
  line+=" cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores,"
  line+=" started $(date -u +%FT%TZ): ${run_hooks[*]}"
  if [[ -n ${HOOKS:-} ]]; then echo "$line" >>"$out/machine.txt"; else echo "$line" >"$out/machine.txt"; fi
  for h in "${run_hooks[@]}"; do
    echo "== $h $(date -u +%FT%TZ)" >&2
    # A hook that fails is recorded, not hidden: its error stays in OUT/NAME.err and the
    # queue goes on with the next hook. The .err file also keeps the hooks' plan logs.
    err=$out/$(name "$h").err
    if [[ $task == vgg ]]; then
      "$out/.vgg" -data "${SPARGO_DATA:?set SPARGO_DATA to your data root (docs/data.md)}/cifar10" -model vgg11 -workers 4 -batch 16 -epochs 3 \
        -lr 0.01 -momentum "$(momentum "$h")" -wd 5e-4 -seed 0 -hook "$h" -progress=false -metrics "$out/$(name "$h").jsonl" \
        2>"$err" || echo "!! $h failed: see $err" >&2
    else
      "$out/.lstm" -data "${SPARGO_DATA:?set SPARGO_DATA to your data root (docs/data.md)}/ptb" -model small -workers 4 -batch 20 -bptt 35 \
        -epochs "${LSTM_EPOCHS:-13}" -steps "${LSTM_STEPS:-0}" -eval-every "${LSTM_EVAL_EVERY:-0}" \
        -eval-limit "${LSTM_EVAL_LIMIT:-0}" -lr 20 -clip 0.25 -schedule ptb -seed "${LSTM_SEED:-0}" -log-every 10 \
        -hook "$h" -progress=false -metrics "$out/$(name "$h").jsonl" 2>"$err" || echo "!! $h failed: see $err" >&2
    fi
    [[ -s $err ]] || rm -f "$err"
  done
  rm -f "$out/.$task"
fi
# The metrics files of hooks that have one (a failed hook's run may have written none: the
# plot leaves it out and says so; lstm's table names its error).
f() { for h in "$@"; do if [[ -s $out/$(name "$h").jsonl ]]; then echo "$out/$(name "$h").jsonl"; else echo "!! no metrics for $h in $out: left out of the plot" >&2; fi; done; }
if [[ $task == vgg ]]; then
  plot() { local png=$1 files; shift; files=$(f "${@:2}"); [[ -n $files ]] || { echo "!! no metrics for $png: not drawn" >&2; return 0; }
    ${SPARGO:-go run ./cmd/spargo} plot -x epochs,time -width 1400 -height 1000 -title "$1" -o "$png" $files; }
  plot $pngs/convergence-vgg11-dense.png "VGG-11, 4 workers: dense and near-lossless hooks" allreduce fp16 bf16 osp powersgd:rank=4,start_iter=10
  plot $pngs/convergence-vgg11-sparse.png "VGG-11, 4 workers: sparse hooks at density 0.01 vs dense" allreduce spardl:density=0.01 spardl:density=0.01,teams=2 oktopk:density=0.01 gaussiank:density=0.01 topka topkdsa gtopk
  plot $pngs/convergence-vgg11-layerwise.png "VGG-11, 4 workers: layer-wise (OMGS family) and COVAP vs dense" allreduce lags:density=0.01 mgs:density=0.01 omgs:density=0.01 covap:interval=2 covap:interval=4 covap:interval=auto
  plot $pngs/convergence-vgg11-compressed.png "VGG-11, 4 workers: quantizers and sparsifiers vs dense and top-k" allreduce topka dgc:density=0.001,warmup=100 qsgd terngrad natural 8bit threshold randomk:density=0.01
  plot $pngs/convergence-vgg11-sign.png "VGG-11, 4 workers: the sign family vs dense" allreduce signsgd signum efsignsgd onebit
  # BENCHMARKS.md's table, into OUT/table.md: test accuracy after each epoch, the last epoch's
  # training loss, the floor of docs/ALGORITHMS.md §0 that applies (✓ met, ✗ not; a hook
  # without one is reported, not judged), images/s of the four workers together (training
  # only; the epochs' mean) and the wall time. A hook whose run failed gets its error.
  python3 - "$out" "${hooks[@]}" >"$out/table.md" <<'PY'
import json, os, sys
out, hooks = sys.argv[1], sys.argv[2:]
name = lambda h: h.replace(":", "_").replace("=", "-").replace(",", "_")
# §0's floors (test accuracy after epoch 3, seed 0): near-lossless hooks 48 %, the sparse
# ones at density 0.01 and powersgd at rank 4 44 %.
def floor(h):
    kind, _, opts = h.partition(":")
    opts = dict(o.partition("=")[::2] for o in opts.split(",") if o)
    if kind in ("allreduce", "fp16", "bf16", "osp"):
        return 48
    if kind in ("spardl", "oktopk", "gaussiank", "topka", "topkdsa", "gtopk", "lags", "mgs", "omgs") \
            and opts.get("density", "0.01") == "0.01":
        return 44
    if kind == "powersgd" and opts.get("rank") == "4":
        return 44
    return None
machine = os.path.join(out, "machine.txt")
if os.path.exists(machine):
    print("Runs: " + "; ".join(l.strip() for l in open(machine) if l.strip()) + ".\n")
print("| hook | epoch 1 | epoch 2 | epoch 3 | train loss, epoch 3 | floor | train img/s | wall s |")
print("|---" * 8 + "|")
for h in hooks:
    path, err = os.path.join(out, name(h) + ".jsonl"), os.path.join(out, name(h) + ".err")
    recs = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
    summ = [r for r in recs if r.get("summary")]
    if not summ:
        lines = [l.strip() for l in open(err) if l.strip() and "level=" not in l] if os.path.exists(err) else []
        why = ("failed: " + lines[-1]) if lines else ("running" if recs else "no result")
        print("| `%s` | %s | | | | | | |" % (h, why))
        continue
    eps, fl = summ[-1]["epochs"], floor(h)
    acc = [100 * e["test_acc"] for e in eps]
    mark = "" if fl is None else ("%d %% %s" % (fl, "✓" if acc[-1] >= fl else "✗"))
    print("| `%s` | %s | %.3f | %s | %.0f | %.0f |" % (h, " | ".join("%.2f %%" % a for a in acc),
          eps[-1]["train_loss"], mark, sum(e["img_s"] for e in eps) / len(eps), summ[-1]["total_s"]))
PY
  cat "$out/table.md"
else
  # Perplexity on a log scale: it falls from ~10,000 to ~150 within an epoch.
  plot() { local png=$1 files; shift; files=$(f "${@:2}"); [[ -n $files ]] || { echo "!! no metrics for $png: not drawn" >&2; return 0; }
    ${SPARGO:-go run ./cmd/spargo} plot -x epochs,time -log-ppl -width 1400 -height 1000 -title "$1" -o "$png" $files; }
  plot $pngs/convergence-lstm-dense.png "LSTM small on PTB, 4 workers: dense and near-lossless hooks" allreduce fp16 bf16 osp powersgd:rank=4,start_iter=10
  plot $pngs/convergence-lstm-sparse.png "LSTM small on PTB, 4 workers: sparse hooks at density 0.01 vs dense" allreduce spardl:density=0.01 spardl:density=0.01,teams=2 oktopk:density=0.01 gaussiank:density=0.01 topka topkdsa gtopk
  plot $pngs/convergence-lstm-layerwise.png "LSTM small on PTB, 4 workers: layer-wise (OMGS family) and COVAP vs dense" allreduce lags:density=0.01 mgs:density=0.01 omgs:density=0.01 covap:interval=2 covap:interval=4 covap:interval=auto
  plot $pngs/convergence-lstm-compressed.png "LSTM small on PTB, 4 workers: quantizers and sparsifiers vs dense and top-k" allreduce topka dgc:density=0.001,warmup=100 qsgd terngrad natural 8bit threshold randomk:density=0.01
  plot $pngs/convergence-lstm-sign.png "LSTM small on PTB, 4 workers: the sign family vs dense" allreduce signsgd signum efsignsgd onebit
  # BENCHMARKS.md's table, into OUT/table.md: the validation perplexity at four of the
  # validations (the last at the end of the run), the test perplexity (whole test stream), the epochs'
  # training loss and words/s (all ranks, validation time left out), the wall time; a hook
  # whose run failed gets its error.
  python3 - "$out" "${hooks[@]}" >"$out/table.md" <<'PY'
import json, math, os, sys
out, hooks = sys.argv[1], sys.argv[2:]
name = lambda h: h.replace(":", "_").replace("=", "-").replace(",", "_")
rows, steps = [], None
for h in hooks:
    path = os.path.join(out, name(h) + ".jsonl")
    recs = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
    vals = [(r["step"], r["val_ppl"]) for r in recs if "step" in r and "val_ppl" in r]
    eps = [r for r in recs if "epoch" in r and "step" not in r]
    err = ""
    if os.path.exists(os.path.join(out, name(h) + ".err")):
        lines = [l.strip() for l in open(os.path.join(out, name(h) + ".err")) if l.strip() and "level=" not in l]
        err = lines[-1] if lines and not eps else ""
    steps = steps or [s for s, _ in vals]
    rows.append((h, dict(vals), eps, err))
if steps and len(steps) > 4:  # four columns, the last the end of the run
    steps = steps[len(steps) // 4 - 1::len(steps) // 4][-4:]
f = lambda x: "%.1f" % x if math.isfinite(x) else str(x)
print("| hook | " + " | ".join("val ppl @%d" % s for s in steps) + " | test ppl | train loss | train words/s | wall s |")
print("|---" * (len(steps) + 5) + "|")
for h, vals, eps, err in rows:
    if not eps:
        print("| `%s` | %s |" % (h, ("failed: " + err) if err else "no result") + " |" * (len(steps) + 3))
        continue
    e = eps[-1]
    print("| `%s` | %s | %s | %.3f | %.0f | %.0f |" % (h, " | ".join(f(vals[s]) if s in vals else "" for s in steps),
          f(e.get("test_ppl", float("nan"))), e["train_loss"], e["words_s"], e["total_s"]))
PY
  cat "$out/table.md"
fi
