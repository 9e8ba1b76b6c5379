# Sourced by run_all.sh / run_train.sh from the repository root: installs aisim (editable, no dependencies) so
# `python3 -m aisim.validation.harness.X` works, falling back to a symlinked import tree where pip cannot install
# (as validation/scripts/env.sh does); keeps NVLink multicast off and the hub offline; sets OUT and the log.
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
LOG=${LOG:-$OUT/log.txt}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -z "${SKIP_INSTALL:-}" ]; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || echo "pip install -e . failed (see log)" | tee -a "$LOG"
fi
if ! python3 -c "import aisim.validation.harness.common" >>"$LOG" 2>&1; then
  echo "aisim not importable after pip: using a symlinked import tree" | tee -a "$LOG"
  _tree=/tmp/aisim-tree/aisim; mkdir -p "$_tree"
  for _f in simulator/*; do ln -sfn "$PWD/$_f" "$_tree/"; done
  for _d in validation hardware_specs model_specs; do ln -sfn "$PWD/$_d" "$_tree/$_d"; done
  export PYTHONPATH=/tmp/aisim-tree:${PYTHONPATH:-}
fi
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,power.limit,memory.total,memory.used --format=csv 2>&1
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
} 2>&1 | tee -a "$LOG"

# run_step NAME HARD_SECONDS COMMAND...: one script under a hard wall-clock cap (SIGINT, then SIGKILL 15 s later);
# its output is appended to the log; a failure is logged and the next script still runs. HARNESS_ARGS (e.g.
# --smoke, for a dry run on a CPU with SKIP_INSTALL=1) is appended to every command.
run_step() {
  local name=$1 hard=$2; shift 2
  echo "=== $name: start $(date -u +%H:%M:%S) (hard cap ${hard}s) ===" | tee -a "$LOG"
  local t0=$SECONDS
  # shellcheck disable=SC2086
  timeout --signal=INT --kill-after=15 "$hard" "$@" ${HARNESS_ARGS:-} 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc after $((SECONDS - t0))s ===" | tee -a "$LOG"
}
