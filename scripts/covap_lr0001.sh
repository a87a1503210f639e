#!/usr/bin/env bash
# Convergence runs for issue 24 part 2 (COVAP at lr 0.001) on a 16-core machine.
set -u
D=$(cd "$(dirname "$0")" && pwd)
R=/tmp/results; mkdir -p $R
{ lscpu; nproc; free -g; } > $R/cpu.txt 2>&1
head -30 $R/cpu.txt
cd /tmp
xz -dc $D/vgg.xz > vgg; xz -dc $D/lstm.xz > lstm; chmod +x vgg lstm
tar xJf $D/ptb.tar.xz -C /tmp
mkdir -p cifar; ln -sf $D/data_batch_1.bin $D/test_batch.bin $D/batches.meta.txt cifar/
name() { echo "$1" | sed 's/:/_/g; s/=/-/g; s/,/_/g'; }
for s in 0 1; do for h in allreduce covap:interval=2 covap:interval=4; do
  GOMAXPROCS=2 timeout 560 ./vgg -data cifar -model vgg11 -workers 4 -batch 16 -epochs 3 -lr 0.001 -momentum 0.9 -wd 5e-4 \
    -seed $s -hook $h -progress=false -log-every 10 -metrics $R/vgg_$(name $h)_s$s.jsonl > $R/vgg_$(name $h)_s$s.out 2>&1 &
done; done
for h in allreduce covap:interval=2; do
  GOMAXPROCS=2 timeout 560 ./lstm -data /tmp/ptb -model small -workers 4 -batch 20 -bptt 35 -epochs 1 -lr 1 -clip 5 -seed 0 \
    -hook $h -progress=false -log-every 10 -metrics $R/lstm_$(name $h).jsonl > $R/lstm_$(name $h).out 2>&1 &
done
start=$(date +%s)
while [ -n "$(jobs -r)" ]; do sleep 20; echo "t=$(( $(date +%s)-start ))s $(grep -h '^epoch' $R/*.out | wc -l) epoch lines"; tar czf $OUT/results.tgz -C /tmp results; done
wait
tar czf $OUT/results.tgz -C /tmp results
grep -h "^done\|^epoch" $R/*.out
