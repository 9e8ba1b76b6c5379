"""GEMM time by operand layout and bias: cuBLAS's kernels for each layout, and for a GEMM with a bias, differ.

    python3 -m aisim.validation.harness.gemm_layout --out OUT/gemm-layout.jsonl [--max-minutes 6] [--rounds 2]
        [--sweep] [--smoke]

The calibration's GEMM tables time ``torch.matmul(x, W.t())`` (nn.Linear's forward: the first operand row-major,
the second a transposed view, "nt"). A training step also runs the other layouts: nn.Linear's input gradient
``dY @ W`` ("nn"), its weight gradient ``dY.t() @ X`` ("tn"), and GPT-2's Conv1D forward ``X @ W`` with W stored
(in, out) ("nn"). Here every layout of one (M, N, K) is timed next to the others on the same operands' sizes, over a
grid of generic shapes (hidden sizes of powers of two and their 1.5x, 512-8192 rows; not a judged model's), fp32
with TF32 off, bf16 and fp16. A linear layer with a bias runs ``torch.addmm(b, x, W.t())`` (F.linear; Conv1D:
``addmm(b, x, W)``), which PyTorch sends to cuBLASLt with a bias epilogue, another kernel family than the plain
GEMM's: ``addmm`` records time those two layouts. Operands rotate over enough sets to exceed the L2 cache twice, as
calibrate's GEMMs do. ``--sweep`` instead times x @ W.t() at every multiple of 128 from 1024 to 8192 along one
of M, N, K (the others 2048), where the wave quantisation over the SMs shows between the table's grid points;
``validation/scripts/derive_gemm_waves.py`` derives the calibration's ``gemm_wave_tiles`` from it and reports the
layout and bias ratios.

Records: ``{"type": "gemm_layout", "round", "dtype", "op": mm|addmm, "m", "n", "k", "layout": nt|nn|tn,
"ms": [...], "median_ms", "status"}`` (an output of M x N; K the inner dimension); with --sweep ``{"type":
"gemm_sweep", "dtype", "axis", "op", "m", "n", "k", "layout": "nt", ...}``. The first H100 grid run
(gemm-layout-h100.jsonl) predates the addmm variants: its records have no "op" (all mm).
"""
from __future__ import annotations

import math
import statistics

from . import common

SCRIPT = "gemm_layout"
VARIANTS = (("mm", "nt"), ("mm", "nn"), ("mm", "tn"), ("addmm", "nt"), ("addmm", "nn"))
ROWS = (512, 2048, 8192)
NK = ((1024, 1024), (4096, 1024), (1024, 4096), (2048, 2048), (6144, 2048), (2048, 6144), (3072, 3072),
      (4096, 4096), (12288, 3072), (3072, 12288))
L2_ROTATE_BYTES = 2 * 60e6          # twice an H100/H200 L2 (50 / 60 MB)


def layout_calls(op: str, layout: str, m: int, n: int, k: int, device, dtype, sets: int):
    """Callables computing an (M x N) output over inner dimension K with the operands laid out as ``layout``:
    first letter the first operand (n: stored M x K, t: stored K x M and transposed), second the second (n: stored
    K x N, t: stored N x K and transposed)."""
    import torch

    def operand(rows: int, cols: int, transposed: bool):
        return torch.randn(cols, rows, device=device, dtype=dtype).t() if transposed else \
            torch.randn(rows, cols, device=device, dtype=dtype)

    pairs = [(operand(m, k, layout[0] == "t"), operand(k, n, layout[1] == "t")) for _ in range(sets)]
    if op == "addmm":
        bias = torch.randn(n, device=device, dtype=dtype)
        return [lambda a=a, b=b: torch.addmm(bias, a, b) for a, b in pairs]
    return [lambda a=a, b=b: torch.mm(a, b) for a, b in pairs]


def rotation(m: int, n: int, k: int, elem_bytes: int) -> int:
    return max(1, min(8, math.ceil(L2_ROTATE_BYTES / ((m * k + k * n + m * n) * elem_bytes))))


def sweep_cases(smoke: bool):
    """Dense sweeps of one dimension at a time (the others generic, 2048): where the wave quantisation over the SMs
    shows, between the calibration grid's points."""
    steps = (16, 32, 48) if smoke else tuple(range(1024, 8192 + 1, 128))
    base = 32 if smoke else 2048
    for dtype in (("fp32",) if smoke else ("fp32", "bf16")):
        for axis in ("n", "m", "k"):
            for v in steps:
                dims = {"m": base, "n": base, "k": base, axis: v}
                yield dtype, axis, dims["m"], dims["n"], dims["k"]


def cases(smoke: bool):
    dtypes = ("fp32",) if smoke else ("fp32", "bf16", "fp16")
    rows, nk = ((16, 32), ((32, 64), (64, 32))) if smoke else (ROWS, NK)
    for dtype in dtypes:
        for m in rows:
            for n, k in nk:
                yield dtype, m, n, k


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny shapes on the CPU")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the grid (layouts interleaved per shape)")
    parser.add_argument("--sweep", action="store_true", help="instead: dense sweeps of M, N and K (mm and addmm, nt)")
    args = parser.parse_args(argv)
    device, out, budget, measure_host = common.open_run(SCRIPT, args)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dtypes = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2), "fp16": (torch.float16, 2)}
    with torch.inference_mode():
        if args.sweep:
            sweep(args, device, out, budget, dtypes)
            return common.close_run(out, measure_host)
        for rnd in range(1 if args.smoke else args.rounds):
            for dtype, m, n, k in cases(args.smoke):
                if budget.expired():
                    break
                dt, size = dtypes[dtype]
                for op, layout in VARIANTS:
                    rec = {"type": "gemm_layout", "round": rnd, "dtype": dtype, "op": op, "m": m, "n": n, "k": k,
                           "layout": layout}
                    if time_record(rec, lambda: layout_calls(op, layout, m, n, k, device, dt,
                                                             rotation(m, n, k, size)),
                                   device, 20.0, 2 if args.smoke else 5, out):
                        print(f"[gemm_layout] r{rnd} {dtype} {op} {layout} {m}x{n}x{k}: {rec['median_ms']:.4f} ms",
                              flush=True)
    return common.close_run(out, measure_host)


def time_record(rec: dict, build, device, window_ms: float, windows: int, out) -> bool:
    """Time the calls ``build()`` returns into ``rec`` (ms, median_ms, status) or record why it failed, write it
    (a fatal device error is written, then raised) and free the operands; True when timed."""
    calls = None
    try:
        calls = build()
        ms, _ = common.time_calls(calls, device, window_ms=window_ms, windows=windows, max_reps=2000)
        rec.update(ms=common.rounded(ms, 5), median_ms=round(statistics.median(ms), 5), status="ok")
    except Exception as exc:  # noqa: BLE001 - recorded per case
        status, error = common.classify_error(exc)
        rec.update(status=status, error=error)
        if common.is_fatal_device_error(exc):
            out.write(rec)
            raise
    out.write(rec)
    calls = None
    common.free_memory(collect=False)
    return rec["status"] == "ok"


def sweep(args, device, out, budget, dtypes) -> None:
    for dtype, axis, m, n, k in sweep_cases(args.smoke):
        if budget.expired():
            break
        dt, size = dtypes[dtype]
        for op in ("mm", "addmm"):
            rec = {"type": "gemm_sweep", "dtype": dtype, "axis": axis, "op": op, "m": m, "n": n, "k": k,
                   "layout": "nt"}
            time_record(rec, lambda: layout_calls(op, "nt", m, n, k, device, dt, rotation(m, n, k, size)), device,
                        10.0, 2 if args.smoke else 3, out)
        common.free_memory(collect=False)


if __name__ == "__main__":
    raise SystemExit(main())
