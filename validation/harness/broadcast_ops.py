"""Eager attention's large elementwise kernels with a broadcast operand, timed alone; none of it a judged row.

    python3 -m aisim.validation.harness.broadcast_ops --out OUT/broadcast-ops.jsonl [--max-minutes 4] [--smoke]

A kernel profile of bloom-560m forward 16 x 1024 on an H100 (validation/data/profiles/h100-profile-2026-11-27.txt)
shows three things the meta-device trace prices wrongly:
1. ``torch.baddbmm(alibi, q, k)`` with a broadcast ``input`` (BLOOM's ALiBi bias, (B*H, 1, S)): ATen first copies
   the expanded input into the output (a broadcast copy, PyTorch's non-vectorized elementwise kernel), then the GEMM
   reads it back as C. Timed: the copy alone (``empty(B*H, S, S).copy_(alibi.expand(...))``), the baddbmm, and the
   bmm of the same shapes.
2. The attention mask added over the heads, (B, H, S, S) + (B, 1, S, S): a broadcast on an outer dim, which also
   leaves the vectorized kernel. Timed next to the same add without broadcast.
3. ``F.softmax(x, dim=-1, dtype=torch.float32)``: on CUDA a half input is read by the softmax kernel itself
   (``_softmax(half_to_float=True)``), a bfloat16 one is cast first (ATen softmax.cpp); timed for both.

Records: ``{"type": "case", "op", "dtype", "shape", "bytes", "ms": [...], "median_ms", "status"}``; ``bytes`` is
what the kernel must move (inputs read once at their own size, outputs written once).
"""
from __future__ import annotations

import statistics

from . import common

SCRIPT = "broadcast_ops"
SHAPES = ((16, 16, 1024), (4, 16, 2048), (8, 32, 1024), (64, 16, 512))     # (B, H, S)


def cases(b: int, h: int, s: int, dtype, device):
    """(op, bytes, fn) of one attention shape."""
    import torch
    import torch.nn.functional as F

    item = torch.finfo(dtype).bits // 8
    big = b * h * s * s
    alibi = torch.randn(b * h, 1, s, device=device, dtype=dtype)
    q = torch.randn(b * h, s, 64, device=device, dtype=dtype)
    k = torch.randn(b * h, 64, s, device=device, dtype=dtype)
    out = torch.empty(b * h, s, s, device=device, dtype=dtype)
    x = torch.randn(b, h, s, s, device=device, dtype=dtype)
    y = torch.randn(b, h, s, s, device=device, dtype=dtype)
    mask = torch.randn(b, 1, s, s, device=device, dtype=dtype)
    gemm_io = 2 * b * h * s * 64 * item
    rows = [("broadcast_copy", big * item, lambda: out.copy_(alibi.expand(b * h, s, s))),
            ("baddbmm_broadcast", big * item + gemm_io, lambda: torch.baddbmm(alibi, q, k, beta=1.0, alpha=0.125)),
            ("bmm", big * item + gemm_io, lambda: torch.bmm(q, k)),
            ("add_outer_broadcast", 2 * big * item + b * s * s * item, lambda: x + mask),
            ("add_contiguous", 3 * big * item, lambda: x + y)]
    if dtype in (torch.float16, torch.bfloat16):
        rows.append(("softmax_to_fp32", big * (item + 4), lambda: F.softmax(x, dim=-1, dtype=torch.float32)))
    return rows


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "one tiny shape on the CPU")
    args = parser.parse_args(argv)
    device, out, budget, measure_host = common.open_run(SCRIPT, args)
    import torch

    shapes = ((2, 2, 32),) if args.smoke else SHAPES
    dtypes = (torch.float32,) if device.type != "cuda" else (torch.float16, torch.bfloat16, torch.float32)
    with torch.inference_mode():
        for b, h, s in shapes:
            for dtype in dtypes:
                if budget.expired():
                    break
                name = str(dtype).removeprefix("torch.")
                try:
                    for op, nbytes, fn in cases(b, h, s, dtype, device):
                        ms, _ = common.time_calls([fn], device, window_ms=20.0, windows=2 if args.smoke else 5,
                                                  max_reps=500)
                        rec = {"type": "case", "op": op, "dtype": name, "shape": [b, h, s], "bytes": nbytes,
                               "ms": common.rounded(ms, 5), "median_ms": round(statistics.median(ms), 5),
                               "status": "ok"}
                        out.write(rec)
                        print(f"[broadcast_ops] {op} {name} {b}x{h}x{s}: {rec['median_ms']:.4f} ms "
                              f"({nbytes / rec['median_ms'] / 1e6:.0f} GB/s)", flush=True)
                except Exception as exc:  # noqa: BLE001 - recorded per shape
                    status, error = common.classify_error(exc)
                    out.write({"type": "case", "dtype": name, "shape": [b, h, s], "status": status, "error": error})
                    if common.is_fatal_device_error(exc):
                        raise
                common.free_memory()
    return common.close_run(out, measure_host)


if __name__ == "__main__":
    raise SystemExit(main())
