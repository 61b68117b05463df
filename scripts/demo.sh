#!/usr/bin/env bash
# The main job: starts 4 local stage agents and trains ResNet20 on
# Fashion-MNIST split into 4 pipeline stages in PipeDream mode (1F1B with
# weight stashing) for a short run, with a progress bar, then prints the test
# accuracy, the throughput and where the Chrome trace went.
set -euo pipefail
build=${1:-build}
steps=${DEMO_STEPS:-300}
exec "$build/axon-run" train --model resnet20 --dataset fashion-mnist \
  --local 4 --mode pipedream --steps "$steps" --batch 32 \
  --optim opt=sgd,lr=0.05,momentum=0.9 --eval-limit 2000 --eval-batch 250 \
  --trace pipeline_trace.json --csv pipeline_metrics.csv
