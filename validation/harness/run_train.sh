#!/usr/bin/env bash
# Two-GPU harness call, from the repository root:  bash validation/harness/run_train.sh   (results in $OUT)
# The train_step suite (1 GPU plain, then DDP and FSDP2 on 2 GPUs; bf16-mixed / bf16-true; checkpointing; cases
# expected to run out of memory included), ~7 minutes: soft budget TRAIN_MIN (default 6.2 min, checked before
# every case) and a hard cap 40 s later. Files: train.jsonl log.txt
set -o pipefail
cd "$(dirname "$0")/../.."
source validation/harness/_setup.sh
TRAIN_MIN=${TRAIN_MIN:-6.2}
run_step train_step "$(python3 -c "print(int($TRAIN_MIN * 60 + 40))")" python3 -m aisim.validation.harness.train_step \
  --suite --gpus 2 --out "$OUT/train.jsonl" --max-minutes "$TRAIN_MIN"
echo "done $(date -u +%H:%M:%S)" | tee -a "$LOG"
ls -la "$OUT" | tee -a "$LOG"
