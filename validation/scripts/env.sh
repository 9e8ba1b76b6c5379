# Source from the repository root on a GPU machine: makes `aisim` importable from a plain checkout (the folders
# linked into an import tree as pyproject.toml maps them), installs carried pydantic wheels (.whl/) where the
# machine lacks pydantic, and keeps NVLink multicast off in NCCL. Sets OUT (default ./out).
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c "import pydantic" 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
_tree=/tmp/aisim-tree/aisim; mkdir -p "$_tree"
for _f in simulator/*; do ln -sfn "$PWD/$_f" "$_tree/"; done
for _d in validation hardware_specs model_specs; do ln -sfn "$PWD/$_d" "$_tree/$_d"; done
export PYTHONPATH=/tmp/aisim-tree:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,power.limit,memory.total --format=csv | tee "$OUT/gpus.csv"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
