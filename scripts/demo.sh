#!/usr/bin/env bash
# The main job: starts 4 local stage agents and trains ResNet20 on
# Fashion-MNIST split into 4 pipeline stages in PipeDream mode (1F1B with
# weight stashing) for a short run, with a progress bar, then prints the test
# accuracy, the throughput and where the Chrome trace went; then draws the
# run (loss, samples/s, per-stage busy and bubble; the test accuracy in the
# title) into pipeline_metrics.png with scripts/plot_run.sh, when gnuplot is
# installed.
set -euo pipefail
build=${1:-build}
steps=${DEMO_STEPS:-300}
here=$(dirname "$0")
# The progress bar goes to stderr; stdout (the summary) is kept for the plot.
"$build/axon-run" train --model resnet20 --dataset fashion-mnist \
  --local 4 --mode pipedream --steps "$steps" --batch 32 \
  --optim opt=sgd,lr=0.05,momentum=0.9 --eval-limit 2000 --eval-batch 250 \
  --trace pipeline_trace.json --csv pipeline_metrics.csv | tee pipeline_summary.txt
if command -v gnuplot >/dev/null; then
  bash "$here/plot_run.sh" pipeline_metrics.csv pipeline_metrics.png pipeline_summary.txt ||
    echo "demo: the plot failed (the run itself succeeded)"
else
  echo "demo: gnuplot is not installed (apt-get install gnuplot-nox): no pipeline_metrics.png"
fi
