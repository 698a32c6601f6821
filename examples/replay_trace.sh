#!/usr/bin/env bash
# Replay a real trace (ServeGen m-small: 14 days of 10-minute request rates) through tideserve's
# forecast-driven hot/cold policy and the baselines, then write the report and the timeline plot.
# Days 1-7 train the forecaster and the hot pool; days 8-14 are judged.
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE=${TRACE:-benchmarks/traces/servegen_language_m-small_total.csv}
OUT=${OUT:-out/replay}
mkdir -p "$OUT"
python -m autoscaling replay \
  --trace "$TRACE" \
  --config cluster.yaml \
  --train-days 7 \
  --scale-to-peak-replicas 20 \
  --replica-capacity-rps 20 \
  --cold-start-s 120 \
  --json "$OUT/replay.json" \
  --plot "$OUT/replay.png"
echo "report: $OUT/replay.json  plot: $OUT/replay.png"
