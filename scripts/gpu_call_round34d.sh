#!/usr/bin/env bash
# On the GPU machine, call 4 of round 34 (#21): why a bench run whose first batch is 8 reads it
# ~7% low (`--batches 8` 5,449 tok/s against 5,877-5,900 in `--batches 1,2,8`): the same batch
# after other rounds, after a longer warm-up, with its rows' prompts cached or not.
set -u
source scripts/gpu_lib.sh
model 0.6b
row "8" --model-dir /tmp/m-0.6b --batches 8
row "8,8" --model-dir /tmp/m-0.6b --batches 8,8
row "2,8" --model-dir /tmp/m-0.6b --batches 2,8
row "1,2,8" --model-dir /tmp/m-0.6b --batches 1,2,8
row "8 warmup 128" --model-dir /tmp/m-0.6b --batches 8 --warmup-new 128
row "8 new 512" --model-dir /tmp/m-0.6b --batches 8 --new 512
row "1,2,8 new 512" --model-dir /tmp/m-0.6b --batches 1,2,8 --new 512
