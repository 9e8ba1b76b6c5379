#!/usr/bin/env bash
# One measurement session on a GPU machine, run from the repository root:
#   bash validation/scripts/gpu_session.sh DEVICE SUITE SUITE_MINUTES [calibrate|nocalibrate]
# e.g. bash validation/scripts/gpu_session.sh h100-sxm h100 6.5
# Calibrates the local GPU (aisim calibrate) and measures a validation suite; results go to $OUT (or ./out).
# Works from a plain checkout: the package folders are linked into an `aisim` import tree, as pyproject.toml
# maps them; pydantic wheels are installed from .whl/ where the machine lacks pydantic.
set -u
DEVICE=$1; SUITE=$2; MINUTES=${3:-6}; CAL=${4:-calibrate}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c "import pydantic" 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
tree=/tmp/aisim-tree/aisim; mkdir -p "$tree"
for f in simulator/*; do ln -sfn "$PWD/$f" "$tree/"; done
for d in validation hardware_specs model_specs; do ln -sfn "$PWD/$d" "$tree/$d"; done
export PYTHONPATH=/tmp/aisim-tree:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,power.limit,memory.total --format=csv | tee "$OUT/gpus.csv"
python3 -c "import torch, transformers, aisim; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
if [ "$CAL" = calibrate ]; then
  python3 -m aisim.validation.calibrate --device "$DEVICE" --out "$OUT/$DEVICE.yaml" 2>&1 | tail -25
fi
python3 -m aisim.validation.runner "validation/suites/$SUITE.yaml" --out "$OUT/$DEVICE-$SUITE.jsonl" \
  --max-minutes "$MINUTES" --no-progress 2>&1 | tee "$OUT/$DEVICE-$SUITE.log" | tail -60
