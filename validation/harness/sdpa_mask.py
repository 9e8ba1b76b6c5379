"""Microbenchmark: PyTorch SDPA with an explicit [1, 1, Q, K] bf16 mask (the kernel transformers' paged|sdpa
attention runs, integrations/sdpa_paged.py), over a grid of query and key counts, to calibrate aisim's
packed-mask attention cost. Random data, CUDA-event timing, median; one JSON line per shape.

    python -m aisim.validation.harness.sdpa_mask --out FILE.jsonl [--max-minutes M] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import time

from . import common

GRID_Q = (1, 8, 64, 256, 1024, 2048, 4096, 8192)
GRID_K = (256, 1024, 4096, 16384, 65536)
HEADS, HEAD_DIM = 32, 128


def bench(torch, q: int, k: int, heads: int, device) -> dict:
    dt = torch.bfloat16
    query = torch.randn(1, heads, q, HEAD_DIM, device=device, dtype=dt)
    key = torch.randn(1, heads, k, HEAD_DIM, device=device, dtype=dt)
    value = torch.randn(1, heads, k, HEAD_DIM, device=device, dtype=dt)
    mask = torch.zeros(1, 1, q, k, device=device, dtype=dt)
    mask.masked_fill_(torch.rand(q, k, device=device) < 0.5, float("-inf"))
    mask[..., 0] = 0.0   # every query sees at least one key

    def step():
        torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=False)

    times = common.time_steps(step, device, warmup=3, min_trials=10, max_trials=200, min_time_s=0.2)
    med = sorted(times)[len(times) // 2]
    flops = 4.0 * q * k * heads * HEAD_DIM
    nbytes = 2 * (2 * q * heads * HEAD_DIM + 2 * k * heads * HEAD_DIM + q * k)
    return {"type": "case", "q": q, "k": k, "heads": heads, "head_dim": HEAD_DIM, "median_ms": med,
            "tflops": flops / (med / 1e3) / 1e12, "gbytes_per_s": nbytes / (med / 1e3) / 1e9, "flops": flops,
            "bytes": nbytes, "status": "ok"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--max-minutes", type=float, default=2.0)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    import torch

    device = common.pick_device()
    deadline = time.time() + args.max_minutes * 60
    grid = [(q, k) for q in (GRID_Q[:2] if args.smoke else GRID_Q) for k in (GRID_K[:1] if args.smoke else GRID_K)
            if q * k <= 8192 * 16384 * 2]
    with open(args.out, "a") as f:
        f.write(json.dumps(common.header("sdpa_mask", args), default=str) + "\n")
        for q, k in grid:
            if time.time() > deadline:
                break
            try:
                row = bench(torch, q, k, 4 if args.smoke else HEADS, device)
            except Exception as exc:  # noqa: BLE001 - recorded, the grid goes on
                row = {"type": "case", "q": q, "k": k, "status": common.classify_error(exc)[0], "error": str(exc)[:200]}
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"[sdpa_mask] q {q} k {k}: {row.get('median_ms')} ms {row.get('tflops', 0):.1f} TFLOP/s", flush=True)
            common.free_memory()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
