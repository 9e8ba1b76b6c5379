"""fp8 GEMM microbenchmark: ``torch._scaled_mm`` (float8_e4m3fn inputs, bf16 output) against bf16 ``torch.matmul``.

    python3 -m aisim.validation.harness.fp8_gemm --out OUT/fp8.jsonl [--max-minutes 0.6] [--smoke]

For every M in --m and (K, N) in --shapes (an activation [M, K] times a weight [K, N], as a Linear with
in_features K and out_features N): three kernels, each a case line

- ``bf16``:        torch.matmul(a_bf16 [M,K], w_bf16 [K,N])
- ``fp8-tensor``:  torch._scaled_mm(a_fp8, w_fp8, scale_a=fp32 scalar, scale_b=fp32 scalar, out_dtype=bf16)
- ``fp8-row``:     torch._scaled_mm(a_fp8, w_fp8, scale_a=fp32 [M,1], scale_b=fp32 [1,N], out_dtype=bf16)
- ``fp8-tensor-fast``: fp8-tensor with use_fast_accum=True (the setting fp8 training recipes use in the forward)

The weight operand is column-major (``w = W.t()`` with W [N, K] row-major), as cuBLASLt fp8 requires. Data is
random normal (never zeros), quantised with per-tensor / per-row absmax scales. Timing: CUDA events around a
loop of calls that cycles through enough weight copies to exceed 2x the L2 cache (so each call streams its weight
from HBM, as a model's distinct layers do), window >= 25 ms, 7 windows, median per call. Achieved TFLOP/s =
2*M*N*K / time; fraction of the dense datasheet peak (H100/H200 SXM: bf16 989.4e12, fp8 1978.9e12 FLOP/s). The
relative error of the fp8 result against the bf16 product is recorded as a check of the scaling.
"""
from __future__ import annotations

import math
import statistics

from . import common

SCRIPT = "fp8_gemm"
DEFAULT_M = "16,128,1024,4096,8192"
# (K, N): in_features x out_features of LLM linears (Llama-3-8B attention / up / down, 70B-class square).
DEFAULT_SHAPES = "4096x4096,4096x14336,14336x4096,8192x8192"
# Dense (no sparsity) datasheet peaks, FLOP/s. H200 SXM has the same tensor-core peaks as H100 SXM.
PEAKS = {
    "H100 SXM": {"bf16": 989.4e12, "fp8": 1978.9e12},
    "H100 NVL": {"bf16": 835.5e12, "fp8": 1670.5e12},
    "H100 PCIe": {"bf16": 756.5e12, "fp8": 1513.0e12},
    "H200": {"bf16": 989.4e12, "fp8": 1978.9e12},
}
L2_BYTES = 50 * 2 ** 20     # H100 / H200: 50 MiB


def datasheet_peak(gpu_name: str) -> tuple[str | None, dict | None]:
    name = gpu_name.upper()
    if "H200" in name:
        return "H200", PEAKS["H200"]
    if "H100" in name:
        if "PCIE" in name:
            return "H100 PCIe", PEAKS["H100 PCIe"]
        if "NVL" in name:
            return "H100 NVL", PEAKS["H100 NVL"]
        return "H100 SXM", PEAKS["H100 SXM"]
    return None, None


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        k, n = item.lower().split("x")
        shapes.append((int(k), int(n)))
    return shapes


def _quantize(x, per_row: bool):
    """(fp8 tensor, fp32 scale) with x ~= fp8 * scale; per-row scales [rows, 1] or one scalar."""
    import torch

    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    amax = x.abs().amax(dim=-1, keepdim=True) if per_row else x.abs().amax()
    scale = (amax.float() / fp8_max).clamp(min=1e-12)
    q = (x.float() / scale).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
    return q, scale


def run_shape(m: int, k: int, n: int, device, kernels: list[str], args, peaks: dict | None) -> list[dict]:
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(args.seed + m * 7 + k * 3 + n)
    a = torch.randn(m, k, generator=g, device=device, dtype=torch.float32)
    base_w = torch.randn(n, k, generator=g, device=device, dtype=torch.float32) / math.sqrt(k)
    copies = 1 if device.type != "cuda" else max(1, min(args.max_copies, math.ceil(2 * L2_BYTES / (k * n))))
    a_bf16 = a.to(torch.bfloat16)
    reference = (a_bf16.float() @ base_w.to(torch.bfloat16).float().t())
    rows = []
    for kernel in kernels:
        row = {"type": "case", "kernel": kernel, "m": m, "k": k, "n": n, "flop": 2 * m * n * k,
               "weight_copies": copies, "status": "ok"}
        try:
            if kernel == "bf16":
                ws = [(base_w * (1 + 0.01 * i)).to(torch.bfloat16).t() for i in range(copies)]   # [K, N] views
                calls = [lambda w=w: torch.matmul(a_bf16, w) for w in ws]
                result = torch.matmul(a_bf16, ws[0])
            else:
                per_row = kernel == "fp8-row"
                fast = kernel.endswith("-fast")
                a8, sa = _quantize(a, per_row)
                ws = []
                for i in range(copies):
                    w8, sw = _quantize(base_w * (1 + 0.01 * i), per_row)   # [N, K] row-major
                    # column-major [K, N] operand; per-row scales [1, N]
                    ws.append((w8.t(), sw.t().contiguous() if per_row else sw))

                def call(w8t, sw, a8=a8, sa=sa, fast=fast):
                    return torch._scaled_mm(a8, w8t, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16,
                                            use_fast_accum=fast)
                calls = [lambda w=w, s=s: call(w, s) for w, s in ws]
                result = calls[0]()
                row["scales"] = "row-wise (a [M,1], b [1,N])" if per_row else "tensor-wise (fp32 scalars)"
                row["use_fast_accum"] = fast
            err = ((result.float() - reference).norm() / reference.norm().clamp(min=1e-12)).item()
            row["rel_err_vs_bf16"] = round(err, 5)
            times = common.time_calls(calls, device, args.window_ms, args.windows, warm=3, max_reps=20000)[0]
            median = statistics.median(times)
            row.update({"median_ms": round(median, 5), "min_ms": round(min(times), 5),
                        "max_ms": round(max(times), 5), "windows": len(times),
                        "tflops": round(2 * m * n * k / (median / 1e3) / 1e12, 3)})
            precision = "bf16" if kernel == "bf16" else "fp8"
            if peaks:
                row["peak_flops"] = peaks[precision]
                row["peak_fraction"] = round(2 * m * n * k / (median / 1e3) / peaks[precision], 4)
            del ws, calls, result
        except Exception as exc:  # noqa: BLE001 - recorded per case
            row["status"], row["error"] = common.classify_error(exc)
            common.free_memory()
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny shapes, seconds on a CPU")
    parser.add_argument("--m", default=DEFAULT_M, help="comma list of M (tokens)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of KxN (in x out features)")
    parser.add_argument("--kernels", default="bf16,fp8-tensor,fp8-row,fp8-tensor-fast")
    parser.add_argument("--window-ms", type=float, default=25.0)
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--max-copies", type=int, default=16, help="weight copies cycled to defeat the L2 cache")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    if args.smoke:
        args.m, args.shapes, args.window_ms, args.windows = "16,64", "64x128,128x64", 2.0, 3
    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
    out = common.JsonlOut(args.out)
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak_name, peaks = datasheet_peak(gpu_name)
    out.write(common.header(SCRIPT, args, peak_table=peak_name, peaks=peaks,
                            scaled_mm_api="torch._scaled_mm", l2_bytes_assumed=L2_BYTES))
    budget = common.Budget(args.max_minutes)
    kernels = [k for k in args.kernels.split(",") if k]
    rows, stopped = [], False
    try:
        for k, n in parse_shapes(args.shapes):
            for m in common.parse_ints(args.m):
                if budget.expired():
                    stopped = True
                    break
                for row in run_shape(m, k, n, device, kernels, args, peaks):
                    out.write(row)
                    rows.append(row)
                common.free_memory()
            if stopped:
                break
    except KeyboardInterrupt:
        stopped = True
    if stopped:
        out.write({"type": "stopped", "reason": "time budget or interrupt", "cases_done": len(rows)})
    common.print_table(rows, ["kernel", "m", "k", "n", "median_ms", "tflops", "peak_fraction", "rel_err_vs_bf16",
                              "status"], title=f"fp8_gemm on {gpu_name} (peak table: {peak_name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
