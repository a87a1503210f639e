#!/usr/bin/env bash
# Training throughput of spargo against PyTorch on whatever x86-64 Linux machine this runs on
# (issue 23): the CPU model and its vector extensions, the kernels' tests on every kernel
# implementation the CPU can run (SPARGO_KERNELS=generic|avx2|avx512), then alternated
# `spargo bench train` / scripts/torch_throughput.py rounds per model at 2 threads and at
# all cores, and a markdown table of the medians for BENCHMARKS.md. Image classifiers are
# measured in images/s, the models that read tokens (lstm-ptb-small, bert-tiny, …: the same
# step on both sides, models.NewTokenStep's) in sequences/s; their rows say so.
#
#   scripts/bench_cpu_matrix.sh                     # defaults below; about 5 minutes on 16 cores
#   MODELS="resnet20 vgg16 vgg11 resnet56" ROUNDS=5 scripts/bench_cpu_matrix.sh
#   MODELS="resnet20 bert-tiny lstm-ptb-small" scripts/bench_cpu_matrix.sh
#
# Environment:
#   MODELS       models of the catalogue (default "resnet20 vgg16"); NAME@S: input S×S
#                (resnet50@64: ResNet-50 on 64×64 images); lstm-* and bert-* rows run on
#                random tokens at bench train's default shapes (LSTM-PTB 20 columns × 35
#                words, BERT 16 × 128 tokens with a vocabulary of 8,000, IMDB 32 × 500)
#   ROUNDS       alternated spargo / PyTorch rounds per model and thread count (default 3)
#   THREADS      thread counts (default "2 ALL"; ALL = nproc)
#   BATCH STEPS  batch size of the image classifiers and timed steps (default 32 and 15)
#   TESTS        0 skips the kernels' tests (default 1)
#   TORCH        the Python with PyTorch (default /usr/bin/python3; rows without PyTorch
#                show "-" where it is missing)
#   SPARGO_BIN   a prebuilt spargo binary (default: go build ./cmd/spargo into a temp dir)
#   BEFORE_BIN   a second spargo binary (e.g. built at an earlier commit) run alternately in
#                every round: its column shows the before figure
#   LAYOUT       "channels-last": SPARGO_BIN's image classifiers run with -channels-last
#                (BEFORE_LAYOUT the same for BEFORE_BIN; BEFORE_BIN=SPARGO_BIN with one of
#                them set compares the two layouts); TORCH_LAYOUT=channels-last runs PyTorch's
#                image classifiers in torch.channels_last
#   TEST_BIN_DIR instead of `go test` (where Go is missing): a directory of test binaries built with
#                `go test -c -o DIR/kernels.test ./internal/kernels/` (and nn.test for ./nn/)
#   OUT          directory for the raw JSON and logs (default: a temp dir, printed)
#
# PyTorch runs with OPENBLAS_NUM_THREADS=1 and OMP_WAIT_POLICY=PASSIVE (so a spinning OpenMP
# pool does not steal the cores of the next spargo run; set OMP_WAIT_POLICY=ACTIVE or unset it
# with OMP_WAIT_POLICY= for the issue's idle-machine setting), --threads as spargo's GOMAXPROCS.
# Every figure is the median over ROUNDS of each run's median step; the ratio is the median of
# the rounds' spargo ÷ PyTorch ratios.
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=${MODELS:-"resnet20 vgg16"}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-"2 ALL"}
BATCH=${BATCH:-32}
STEPS=${STEPS:-15}
TESTS=${TESTS:-1}
TORCH=${TORCH:-/usr/bin/python3}
OUT=${OUT:-$(mktemp -d /tmp/bench_cpu_matrix.XXXXXX)}
mkdir -p "$OUT"
ncpu=$(nproc)

echo "# bench_cpu_matrix: $(date -u +%Y-%m-%dT%H:%M:%SZ), output in $OUT"
model=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1)
# Virtual machines often show a bare "AMD EPYC" or "Intel(R) Xeon(R) Processor": the family and
# model numbers tell the microarchitectures apart (AMD family 23 is Zen 1/2, 25 Zen 3/4, 26 Zen 5).
family=$(sed -n 's/^cpu family[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1)
cpunum=$(sed -n 's/^model[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1)
if [ -n "$model" ] && [ -n "$family" ] && [ -n "$cpunum" ]; then
	model="$model (family $family model $cpunum)"
fi
flags=$(sed -n 's/^flags[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1)
vec=""
for f in avx2 fma f16c avx512f avx512vl avx512bw avx512_bf16 avx512_vnni amx_tile amx_bf16; do
	case " $flags " in *" $f "*) vec="$vec $f" ;; esac
done
echo "cpu: ${model:-unknown}; $ncpu logical CPUs; $(grep -c '^processor' /proc/cpuinfo) in /proc/cpuinfo"
echo "vector extensions:${vec:- none of avx2 avx512 amx}"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
impls="generic"
if has avx2 && has fma; then impls="$impls avx2"; fi
if has avx512f && has avx512vl && has bmi2; then impls="$impls avx512"; fi

if [ -z "${SPARGO_BIN:-}" ]; then
	SPARGO_BIN="$OUT/spargo"
	go build -o "$SPARGO_BIN" ./cmd/spargo
fi

if [ "$TESTS" != 0 ]; then
	for k in $impls; do
		echo "== tests, SPARGO_KERNELS=$k"
		if [ -z "${TEST_BIN_DIR:-}" ] && command -v go >/dev/null; then
			SPARGO_KERNELS=$k go test -count=1 ./internal/kernels/ ./nn/ 2>&1 | tail -5
		elif [ -n "${TEST_BIN_DIR:-}" ]; then
			for pkg in internal/kernels nn; do
				bin="$TEST_BIN_DIR/$(basename $pkg).test"
				[ -x "$bin" ] || { echo "no $bin"; continue; }
				(cd "$pkg" && SPARGO_KERNELS=$k "$bin" -test.count=1 2>&1 | tail -3) || echo "FAIL $pkg ($k)"
			done
		else
			echo "no go and no TEST_BIN_DIR: tests skipped"
		fi
	done
fi

# PASSIVE unless set; set but empty: libgomp's default (an empty value is not valid there)
omp_policy=${OMP_WAIT_POLICY-PASSIVE}
unset OMP_WAIT_POLICY

torch_ok=0
if "$TORCH" -c 'import torch' 2>/dev/null; then
	torch_ok=1
	echo "torch: $("$TORCH" -c 'import torch; print(torch.__version__, torch.backends.mkldnn.is_available())')"
	# Debian's python3-torch calls whatever libblas.so.3 is installed: the reference BLAS
	# (libblas3 alone) runs torch.mm at 2-4 GFLOP/s and makes PyTorch's ResNet, LSTM and
	# BERT figures pathological; `apt-get install libopenblas0-pthread` switches it to OpenBLAS.
	mm=$(OPENBLAS_NUM_THREADS=1 "$TORCH" -c 'import time, torch
torch.set_num_threads(1); a = torch.randn(512, 512); torch.mm(a, a); t = time.perf_counter()
for _ in range(4): torch.mm(a, a)
print("%.1f" % (4 * 2 * 512**3 / (time.perf_counter() - t) / 1e9))')
	echo "torch.mm 512³, 1 thread: $mm GFLOP/s"
	if awk -v g="$mm" 'BEGIN { exit !(g < 10) }'; then
		echo "WARNING: PyTorch runs on a reference BLAS ($(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null)); install OpenBLAS (apt-get install libopenblas0-pthread) before comparing" >&2
	fi
else
	echo "torch: not available ($TORCH): PyTorch columns stay empty"
fi

# median of the numbers on stdin ("-" when none)
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" "$2"; }

# MODEL@S: the model at input size S×S (e.g. resnet50@64); prints the size flag $2 S
size_flag() { case "$1" in *@*) echo "$2 ${1#*@}" ;; esac; }

# a model that reads tokens (LSTM, BERT): sequences/s at its default shape, no -batch
is_tokens() { case "${1%@*}" in lstm-* | bert-*) return 0 ;; esac; return 1; }
# prints the batch flag $1 BATCH for an image classifier $2, nothing for a token model
batch_flag() { is_tokens "$2" || echo "$1 $BATCH"; }

# prints -channels-last for an image classifier $2 when the layout $1 is channels-last
layout_flag() { [ "$1" = channels-last ] && ! is_tokens "$2" && echo -channels-last; true; }

run_spargo() { # bin threads model tag round layout
	local f="$OUT/$4-$3-t$2-r$5.json"
	GOMAXPROCS=$2 "$1" bench train -model "${3%@*}" $(size_flag "$3" -size) $(batch_flag -batch "$3") $(layout_flag "${6:-}" "$3") -steps "$STEPS" -json >"$f" 2>"$f.err" || echo "spargo $4 $3 t$2 failed: $(tail -1 "$f.err")" >&2
	echo "$f"
}


rows=()
for t in $THREADS; do
	[ "$t" = ALL ] && t=$ncpu
	for m in $MODELS; do
		for r in $(seq 1 "$ROUNDS"); do
			run_spargo "$SPARGO_BIN" "$t" "$m" spargo "$r" "${LAYOUT:-}" >/dev/null
			if [ -n "${BEFORE_BIN:-}" ]; then
				run_spargo "$BEFORE_BIN" "$t" "$m" before "$r" "${BEFORE_LAYOUT:-}" >/dev/null
			fi
			if [ $torch_ok = 1 ]; then
				env -u OMP_WAIT_POLICY ${omp_policy:+OMP_WAIT_POLICY=$omp_policy} OPENBLAS_NUM_THREADS=1 "$TORCH" scripts/torch_throughput.py \
					--model "${m%@*}" $(size_flag "$m" --size) $(batch_flag --batch "$m") $(layout_flag "${TORCH_LAYOUT:-}" "$m" | sed 's/^-/--/') --steps "$STEPS" --threads "$t" \
					--json "$OUT/torch-$m-t$t-r$r.json" >"$OUT/torch-$m-t$t-r$r.log" 2>&1 ||
					echo "torch $m t$t failed: $(tail -1 "$OUT/torch-$m-t$t-r$r.log")" >&2
			fi
		done
		# the throughput fields of bench train's and torch_throughput.py's JSON, and the row's label
		if is_tokens "$m"; then
			sk=sequences_per_s tk=seq_s
			f1="$OUT/spargo-$m-t$t-r1.json" label="$m (seq/s)"
			[ -s "$f1" ] && label="$m (seq/s, $(field batch "$f1")×$(field seq_len "$f1") tokens)"
		else
			sk=images_per_s tk=img_s label=$m
		fi
		s=$(for f in "$OUT"/spargo-"$m"-t"$t"-r*.json; do field $sk "$f"; done | median)
		sall=$(for f in "$OUT"/spargo-"$m"-t"$t"-r*.json; do field $sk "$f"; done | xargs -r printf '%.1f / ' 2>/dev/null | sed 's| / $||')
		b=$(for f in "$OUT"/before-"$m"-t"$t"-r*.json; do if [ -e "$f" ]; then field $sk "$f"; fi; done | median)
		p=$(for f in "$OUT"/torch-"$m"-t"$t"-r*.json; do if [ -e "$f" ]; then sed -n "s/.*\"$tk\": \([-0-9.e+]*\).*/\1/p" "$f"; fi; done | median)
		pall=$(for f in "$OUT"/torch-"$m"-t"$t"-r*.json; do if [ -e "$f" ]; then sed -n "s/.*\"$tk\": \([-0-9.e+]*\).*/\1/p" "$f"; fi; done | xargs -r printf '%.1f / ' 2>/dev/null | sed 's| / $||')
		gf=$(for f in "$OUT"/spargo-"$m"-t"$t"-r*.json; do field gflops "$f"; done | median)
		pk=$(for f in "$OUT"/spargo-"$m"-t"$t"-r*.json; do field sgemm_peak_gflops "$f"; done | median)
		rl=$(for f in "$OUT"/spargo-"$m"-t"$t"-r*.json; do field roofline "$f"; done | median)
		# the median of the rounds' own ratios (each pair ran back to back)
		ratio=$(for r in $(seq 1 "$ROUNDS"); do
			fs="$OUT/spargo-$m-t$t-r$r.json" ft="$OUT/torch-$m-t$t-r$r.json"
			[ -s "$fs" ] && [ -s "$ft" ] || continue
			awk -v s="$(field $sk "$fs")" -v p="$(sed -n "s/.*\"$tk\": \([-0-9.e+]*\).*/\1/p" "$ft")" \
				'BEGIN { if (s != "" && p > 0) print s / p }'
		done | median | awk '{ if ($1 == "-") print "-"; else printf "%.2f", $1 }')
		row=$(awk -v m="$label" -v t="$t" -v s="$s" -v sall="$sall" -v b="$b" -v p="$p" -v pall="${pall:--}" -v r="$ratio" -v gf="$gf" -v pk="$pk" -v rl="$rl" \
			'function f(x, d) { return x == "-" || x == "" ? "-" : sprintf("%." d "f", x) }
			BEGIN { printf "| %s | %s | %s (%s) | %s | %s (%s) | %s | %s | %s | %s |", m, t, f(s, 1), sall, f(b, 1), f(p, 1), pall, r, f(gf, 1), f(pk, 0), f(rl, 3) }')
		rows+=("$row")
		echo "$row"
	done
done

echo
echo "### ${model:-unknown} (${ncpu} logical CPUs; batch $BATCH images, $STEPS steps, median of $ROUNDS alternated rounds)"
echo
echo "Throughput in images/s, or in sequences/s for the rows that say so (models that read tokens, at the batch × tokens shown)."
echo
echo "| model | threads | spargo img/s or seq/s (rounds) | before | PyTorch (rounds) | spargo ÷ PyTorch (median of rounds) | spargo GFLOP/s | SGEMM peak GFLOP/s | roofline |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
