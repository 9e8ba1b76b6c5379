#!/usr/bin/env bash
# One measurement session on a GPU machine, run from the repository root:
#   bash validation/scripts/gpu_session.sh DEVICE SUITE SUITE_MINUTES [calibrate|nocalibrate]
# e.g. bash validation/scripts/gpu_session.sh h100-sxm h100 6.5
# Calibrates the local GPU (aisim calibrate) and measures a validation suite; results go to $OUT (or ./out).
set -u
DEVICE=$1; SUITE=$2; MINUTES=${3:-6}; CAL=${4:-calibrate}
source validation/scripts/env.sh
if [ "$CAL" = calibrate ]; then
  python3 -m aisim.validation.calibrate --device "$DEVICE" --out "$OUT/$DEVICE.yaml" 2>&1 | tail -25
fi
python3 -m aisim.validation.runner "validation/suites/$SUITE.yaml" --out "$OUT/$DEVICE-$SUITE.jsonl" \
  --max-minutes "$MINUTES" --no-progress 2>&1 | tee "$OUT/$DEVICE-$SUITE.log" | tail -60
