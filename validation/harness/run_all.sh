#!/usr/bin/env bash
# One-GPU harness call, from the repository root:  bash validation/harness/run_all.sh   (results in $OUT, default ./out)
# Runs serve_cb (continuous batching + step mixes), moe_bench (+ kernel profile), graphs_decode (static cache +
# torch.compile reduce-overhead) and fp8_gemm in sequence, ~7.5 min typical, <= ~9.5 min: each has a soft budget
# (--max-minutes, checked between cases) and a hard cap (timeout). Override the shares with SERVE_MIN, MOE_MIN,
# GRAPHS_MIN, FP8_MIN (soft, minutes). Files: serve_cb.jsonl moe.jsonl moe_profile.txt graphs.jsonl fp8.jsonl log.txt
set -o pipefail
cd "$(dirname "$0")/../.."
source validation/harness/_setup.sh
SERVE_MIN=${SERVE_MIN:-2.2}; MOE_MIN=${MOE_MIN:-1.7}; GRAPHS_MIN=${GRAPHS_MIN:-2.8}; FP8_MIN=${FP8_MIN:-0.5}
# hard cap = soft budget + slack for the case in flight (a torch.compile may run ~1 min past the check) and the summary
hard() { python3 -c "print(int($1 * 60 + $2))"; }

run_step serve_cb "$(hard "$SERVE_MIN" 25)" python3 -m aisim.validation.harness.serve_cb \
  --out "$OUT/serve_cb.jsonl" --step-mix --max-minutes "$SERVE_MIN"
run_step moe_bench "$(hard "$MOE_MIN" 25)" python3 -m aisim.validation.harness.moe_bench \
  --out "$OUT/moe.jsonl" --profile --profile-out "$OUT/moe_profile.txt" --max-minutes "$MOE_MIN"
run_step graphs_decode "$(hard "$GRAPHS_MIN" 45)" python3 -m aisim.validation.harness.graphs_decode \
  --out "$OUT/graphs.jsonl" --batches 1,32,8 --max-minutes "$GRAPHS_MIN"
run_step fp8_gemm "$(hard "$FP8_MIN" 20)" python3 -m aisim.validation.harness.fp8_gemm \
  --out "$OUT/fp8.jsonl" --max-minutes "$FP8_MIN"
echo "done $(date -u +%H:%M:%S)" | tee -a "$LOG"
ls -la "$OUT" | tee -a "$LOG"
