"""Two microbenchmarks of kernels whose cost the judged rows showed aisim had wrong; none of it is a judged row.

    python3 -m aisim.validation.harness.gemm_align --out OUT/gemm-align.jsonl [--max-minutes 6] [--smoke]

1. GEMMs with a leading dimension that is not a multiple of 8 elements (16 bytes in 16-bit). GPT-2's vocabulary is
   50257 and Whisper's 51865: the LM head's GEMMs (``F.linear`` forward, the input gradient ``dY @ W`` and the
   weight gradient ``dY^T @ X``) each have a 50257-wide operand, and cuBLAS cannot give them its aligned Hopper
   kernels (a kernel profile of gpt2-large forward-backward on an H100 showed cutlass sm75 kernels at 1.8-2.7 ms
   each). Each shape is timed next to its aligned twin (N rounded up to a multiple of 8), and an odd inner
   dimension K of a square-ish GEMM checks that the rule is about alignment, not the vocabulary.
2. torch.optim.AdamW, foreach (torch's default on CUDA) and fused, over GPT-like parameter lists (12 layers, hidden
   1024 and 2048: 184M and 670M parameters), fp32 and bf16: one ``step()`` timed with CUDA events, gradients set.

Records: ``{"type": "gemm", "op": fwd|dgrad|wgrad|mm, "dtype", "m", "n", "k", "aligned": bool, "ms": [...],
"median_ms", "status"}`` and ``{"type": "optimizer", "impl", "dtype", "hidden", "params", "tensors", "ms": [...],
"median_ms", "status"}``. ``--tokens`` sets the LM-head GEMMs' row counts (default 1, 2048, 8192).
"""
from __future__ import annotations

import statistics

from . import common

SCRIPT = "gemm_align"
VOCABS = (50257, 51865)              # GPT-2, Whisper (multilingual)
HIDDENS = (768, 1280, 1600)          # gpt2, gpt2-large, gpt2-xl
TOKENS = (1, 2048, 8192)
ODD_K = ((2048, 4096, 1030), (2048, 4096, 1032), (8192, 4096, 4100), (8192, 4096, 4104))   # (M, N, K)


def aligned(n: int, multiple: int = 8) -> int:
    return -(-n // multiple) * multiple


def linear_gemms(m: int, n: int, k: int, device, dtype):
    """The three GEMMs of a linear layer of N outputs over K inputs at M tokens, as autograd runs them."""
    import torch
    import torch.nn.functional as F

    x, w = torch.randn(m, k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype)
    dy = torch.randn(m, n, device=device, dtype=dtype)
    return {"fwd": lambda: F.linear(x, w), "dgrad": lambda: dy.mm(w), "wgrad": lambda: dy.t().mm(x)}


def plain_gemm(m: int, n: int, k: int, device, dtype):
    """One (M x K) @ (K x N) GEMM: an odd K checks that the rule is about alignment, not the vocabulary."""
    import torch

    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
    return {"mm": lambda: a.mm(b)}


def time_ms(fn, device, windows: int = 5) -> list[float]:
    ms, _ = common.time_calls([fn], device, window_ms=20.0, windows=windows, max_reps=2000)
    return ms


def gemm_cases(smoke: bool, tokens: tuple[int, ...] = TOKENS):
    dtypes = ("bf16",) if smoke else ("bf16", "fp16")
    vocabs, hiddens, tokens = ((64 + 1,), (32,), (1, 16)) if smoke else (VOCABS, HIDDENS, tokens)
    for dtype in dtypes:
        for n in vocabs:
            for k in hiddens:
                for m in tokens:
                    for n_ in (n, aligned(n)):
                        yield dtype, "linear", m, n_, k
        for m, n, k in (((16, 32, 33), (16, 32, 40)) if smoke else ODD_K):
            yield dtype, "mm", m, n, k


def optimizer_cases(smoke: bool):
    hiddens = (16,) if smoke else (1024, 2048)
    for dtype in ("fp32", "bf16"):
        for h in hiddens:
            for impl in ("foreach", "fused"):
                yield dtype, h, impl


def gpt_params(h: int, layers: int, vocab: int, device, dtype):
    import torch

    shapes = [(vocab, h)] + [s for _ in range(layers) for s in
                             ((3 * h, h), (3 * h,), (h, h), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,), (h,), (h,),
                              (h,), (h,))]
    params = [torch.nn.Parameter(torch.randn(s, device=device, dtype=dtype) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def run_optimizer(dtype_name: str, h: int, impl: str, device, smoke: bool) -> dict:
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    params = gpt_params(h, 2 if smoke else 12, 64 if smoke else 32000, device, dtype)
    opt = torch.optim.AdamW(params, lr=1e-6, **({"fused": True} if impl == "fused" else {"foreach": True}))
    times = common.time_steps(opt.step, device, warmup=2, min_trials=5, max_trials=20, min_time_s=0.2)
    rec = {"type": "optimizer", "impl": impl, "dtype": dtype_name, "hidden": h,
           "params": sum(p.numel() for p in params), "tensors": len(params), "ms": common.rounded(times, 4),
           "median_ms": round(statistics.median(times), 4), "status": "ok"}
    del opt, params
    common.free_memory()
    return rec


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny shapes on the CPU")
    parser.add_argument("--no-optimizer", action="store_true")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="rows (M) of the LM-head GEMMs")
    args = parser.parse_args(argv)
    device, out, budget, measure_host = common.open_run(SCRIPT, args)
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    with torch.inference_mode():
        for dtype, kind, m, n, k in gemm_cases(args.smoke, tuple(common.parse_ints(args.tokens))):
            if budget.expired():
                break
            try:
                gemms = (linear_gemms if kind == "linear" else plain_gemm)(m, n, k, device, dtypes[dtype])
                for op, fn in gemms.items():
                    ms = time_ms(fn, device, 2 if args.smoke else 5)
                    rec = {"type": "gemm", "op": op, "dtype": dtype, "m": m, "n": n, "k": k,
                           "aligned": n % 8 == 0 and k % 8 == 0, "ms": common.rounded(ms, 5),
                           "median_ms": round(statistics.median(ms), 5), "status": "ok"}
                    out.write(rec)
                    print(f"[gemm_align] {dtype} {op} {m}x{n}x{k}: {rec['median_ms']:.4f} ms", flush=True)
            except Exception as exc:  # noqa: BLE001 - recorded per case
                status, error = common.classify_error(exc)
                out.write({"type": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "status": status, "error": error})
                if common.is_fatal_device_error(exc):
                    raise
            common.free_memory()
    if not args.no_optimizer:
        for dtype, h, impl in optimizer_cases(args.smoke):
            if budget.expired():
                break
            try:
                rec = run_optimizer(dtype, h, impl, device, args.smoke)
            except Exception as exc:  # noqa: BLE001 - recorded per case (fused AdamW needs a GPU)
                status, error = common.classify_error(exc)
                rec = {"type": "optimizer", "impl": impl, "dtype": dtype, "hidden": h, "status": status,
                       "error": error}
                common.free_memory()
                if common.is_fatal_device_error(exc):
                    out.write(rec)
                    raise
            out.write(rec)
            print(f"[gemm_align] AdamW {impl} {dtype} h={h}: {rec.get('median_ms')} ms ({rec['status']})", flush=True)
    return common.close_run(out, measure_host)


if __name__ == "__main__":
    raise SystemExit(main())
