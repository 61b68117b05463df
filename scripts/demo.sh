#!/usr/bin/env bash
# The main job: trains the MLP on Fashion-MNIST for one epoch in one process
# and prints the test accuracy (the pipeline run replaces this once the
# coordinator lands).
set -euo pipefail
build=${1:-build}
exec "$build/axon-run" train --model mlp --dataset fashion-mnist --epochs 1 \
  --batch 64 --optim opt=adamw,lr=2e-3,wd=0,sched=cosine --csv loss_curve.csv
