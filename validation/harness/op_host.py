"""Host cost of one eager call of each common aten op, on tiny tensors, relative to a plain add in the same loop.

    python3 -m aisim.validation.harness.op_host --out OUT/op-host.jsonl [--repeats 7] [--count 2000] [--smoke]

A microbenchmark on non-judged shapes (8 x 64 activations, bf16 on a GPU): per op, the wall time of ``count``
back-to-back calls plus one synchronize, / count (host-bound: the kernels are tiny), ``repeats`` rounds with every op
interleaved so that host drift hits them alike. Each record holds the samples, the median and the median's ratio to
``add`` (torch.add(a, a): one kernel op, what the calibration's eager_kernel_dispatch_s describes). The ratios are
what a per-op host cost would carry from one host to another (as eager_phase_scale does for phases); the eager decode
steps of MoE and dense models differ in their op mix (harness/host_scopes.py), not in their op count alone.
"""
from __future__ import annotations

import statistics
import time

from . import common

SCRIPT = "op_host"


def op_calls(device, dtype) -> dict[str, tuple[str, object]]:
    """name -> (aten op(s) it dispatches, the call)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(8, 64, device=device, dtype=dtype, generator=g)
    w = torch.randn(64, 64, device=device, dtype=dtype, generator=g)
    b = torch.randn(64, device=device, dtype=dtype, generator=g)
    a3 = a.view(2, 4, 64)
    w3 = torch.randn(2, 64, 64, device=device, dtype=dtype, generator=g)
    f = a.float()
    idx = torch.randint(0, 8, (4,), device=device, generator=g)
    ids = torch.randint(0, 60, (32,), device=device, generator=g)
    table = torch.randn(1000, 64, device=device, dtype=dtype, generator=g)
    mask = a > 0
    q = torch.randn(1, 8, 1, 64, device=device, dtype=dtype, generator=g)
    kv = torch.randn(1, 8, 16, 64, device=device, dtype=dtype, generator=g)
    scratch = torch.ones(8, 64, device=device, dtype=dtype)   # the in-place ops' target (its values may run to
    ids_scratch = ids.clone()                                   # inf or 0: the host cost does not depend on them)
    perm = torch.randperm(32, device=device, generator=g)
    inv = torch.empty_like(perm)
    rows = torch.arange(32, device=device)
    return {
        "add": ("aten.add.Tensor", lambda: torch.add(a, a)),
        "mul": ("aten.mul.Tensor", lambda: a * a),
        "neg": ("aten.neg", lambda: -a),
        "rsqrt": ("aten.rsqrt", lambda: torch.rsqrt(a)),
        "pow": ("aten.pow.Tensor_Scalar", lambda: a.pow(2)),
        "mean": ("aten.mean.dim", lambda: a.mean(-1, keepdim=True)),
        "sum": ("aten.sum.dim_IntList", lambda: a.sum(-1)),
        "silu": ("aten.silu", lambda: F.silu(a)),
        "sigmoid": ("aten.sigmoid", lambda: torch.sigmoid(a)),
        "softmax": ("aten._softmax", lambda: torch.softmax(f, -1)),
        "to_fp32": ("aten._to_copy", lambda: a.to(torch.float32)),
        "cat": ("aten.cat", lambda: torch.cat([a, a], -1)),
        "t_contiguous": ("aten.t + aten.clone", lambda: a.t().contiguous()),
        "masked_fill": ("aten.masked_fill.Scalar", lambda: a.masked_fill(mask, 0.0)),
        "index": ("aten.index.Tensor", lambda: a[idx]),
        "index_select": ("aten.index_select", lambda: a.index_select(0, idx)),
        "embedding": ("aten.embedding", lambda: F.embedding(ids, table)),
        "mm": ("aten.mm", lambda: torch.mm(a, w)),
        "addmm": ("aten.addmm", lambda: torch.addmm(b, a, w)),
        "linear": ("aten.t + aten.mm", lambda: F.linear(a, w)),
        "linear_bias": ("aten.t + aten.addmm", lambda: F.linear(a, w, b)),
        "bmm": ("aten.bmm", lambda: torch.bmm(a3, w3)),
        "topk": ("aten.topk", lambda: torch.topk(f, 4, dim=-1)),
        "sort": ("aten.sort", lambda: torch.sort(ids)),
        "cumsum": ("aten.cumsum", lambda: torch.cumsum(ids, 0)),
        "sdpa_decode": ("attention (SDPA, q_len 1)", lambda: F.scaled_dot_product_attention(q, kv, kv)),
        "view": ("aten.view", lambda: a.view(-1)),
        "transpose": ("aten.transpose.int", lambda: a.transpose(0, 1)),
        "unsqueeze": ("aten.unsqueeze", lambda: a.unsqueeze(0)),
        "slice": ("aten.slice.Tensor", lambda: a[:, :32]),
        "expand": ("aten.expand", lambda: a.unsqueeze(0).expand(2, 8, 64)),
        # the rest of what the eager traces hold more than once a step (2026-11-28): LayerNorm models' norms and
        # activations, the MoE routing of transformers' grouped_mm experts (integrations/moe.py
        # grouped_mm_experts_forward: perm // top_k, the sentinel mask, clamp_, masked_fill_, the inverse
        # permutation's index_put_ of an arange), and gpt-oss's / DeepSeek's extra elementwise ops
        "layer_norm": ("aten.native_layer_norm", lambda: F.layer_norm(a, (64,), b, b)),
        "relu": ("aten.relu", lambda: F.relu(a)),
        "tanh": ("aten.tanh", lambda: torch.tanh(a)),
        "gelu": ("aten.gelu", lambda: F.gelu(a)),
        "sub": ("aten.sub.Tensor", lambda: a - a),
        "div_": ("aten.div_.Tensor", lambda: scratch.div_(a)),
        "add_": ("aten.add_.Tensor", lambda: scratch.add_(a)),
        "copy_": ("aten.copy_", lambda: scratch.copy_(a)),
        "clamp": ("aten.clamp", lambda: a.clamp(-1.0, 1.0)),
        "clamp_": ("aten.clamp_", lambda: ids_scratch.clamp_(max=59)),
        "masked_fill_": ("aten.masked_fill_.Scalar", lambda: scratch.masked_fill_(mask, 0.0)),
        "where": ("aten.where.self", lambda: torch.where(mask, a, a)),
        "max_dim": ("aten.max.dim", lambda: a.max(-1)),
        "arange": ("aten.arange", lambda: torch.arange(32, device=device)),
        "zeros": ("aten.zeros", lambda: torch.zeros(8, 64, device=device, dtype=dtype)),
        "floor_divide": ("aten.floor_divide", lambda: ids // 4),
        "ge_scalar": ("aten.ge.Scalar", lambda: ids >= 30),
        "gt_tensor": ("aten.gt.Tensor", lambda: ids > ids),
        "bitwise_and": ("aten.bitwise_and.Tensor", lambda: mask & mask),
        "index_put_": ("aten.index_put_", lambda: inv.index_put_((perm,), rows)),
        "cos": ("aten.cos", lambda: torch.cos(f)),
        "empty_like": ("aten.empty_like", lambda: torch.empty_like(a)),
        "split": ("aten.split.Tensor", lambda: a.split(32, -1)),
        "detach": ("aten.detach", lambda: a.detach()),
    }


# decode-shaped GEMMs (M x K @ K x N, bf16): Llama-3-8B's projections at a few batch sizes
DECODE_GEMMS = ((1, 4096, 6144), (1, 4096, 4096), (1, 4096, 28672), (1, 14336, 4096), (8, 4096, 28672),
                (32, 4096, 28672))


def issue_per_call_s(fn, count: int, device) -> float:
    """Host seconds to issue one call, the GPU left to run behind: ``count`` calls after a sync, timed before the
    sync that drains them (count well below the launch queue's depth, so the host never waits)."""
    common.sync(device)
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    dt = time.perf_counter() - t0
    common.sync(device)
    return dt / count


def decode_gemms(device, dtype, repeats: int, count: int = 40) -> list[dict]:
    """Host issue cost of decode-shaped GEMMs relative to a plain add issued the same way, and the kernels one call
    launches (torch.profiler with CUDA activities, after everything else: CUPTI may stay attached)."""
    import torch

    a = torch.randn(8, 64, device=device, dtype=dtype)
    calls = {"add": lambda: torch.add(a, a)}
    for m, k, n in DECODE_GEMMS:
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype)
        calls[f"linear_{m}x{k}x{n}"] = (lambda x=x, w=w: torch.nn.functional.linear(x, w))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for fn in calls.values():
            fn()
        for _ in range(repeats):
            for name, fn in calls.items():
                samples[name].append(issue_per_call_s(fn, count, device))
        kernels = {}
        if device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            for name, fn in calls.items():
                common.sync(device)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    fn()
                    common.sync(device)
                kernels[name] = [n for n, _ in common.device_events(prof)]
    base = statistics.median(samples["add"])
    return [{"type": "decode_gemm", "name": name, "samples_s": vals, "median_s": statistics.median(vals),
             "ratio_to_add": round(statistics.median(vals) / base, 4), "kernels": kernels.get(name)}
            for name, vals in samples.items()]


def wall_per_call_s(fn, count: int, device) -> float:
    common.sync(device)
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    common.sync(device)
    return (time.perf_counter() - t0) / count


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "the CPU, a few calls per op, seconds")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--no-host", action="store_true", help="skip the host microbenchmark lines")
    parser.add_argument("--decode-gemms", action="store_true", help="also the issue cost and kernel count of "
                        "decode-shaped GEMMs (last: it profiles with CUDA activities)")
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
        args.repeats, args.count = 2, 20
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out, budget, measure_host = common.start_run(SCRIPT, args, device)
    calls = op_calls(device, dtype)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    errors: dict[str, str] = {}
    with torch.inference_mode():
        for name, (_, fn) in calls.items():          # warm-up: first-call dispatch and library handles
            try:
                for _ in range(5):
                    fn()
            except Exception as exc:  # noqa: BLE001 - recorded per op
                errors[name] = common.classify_error(exc)[1]
        for _ in range(args.repeats):
            if budget.expired():
                break
            for name, (_, fn) in calls.items():
                if name not in errors:
                    samples[name].append(wall_per_call_s(fn, args.count, device))
    base = statistics.median(samples["add"]) if samples["add"] else None
    for name, (aten, _) in calls.items():
        vals = samples[name]
        rec = {"type": "op", "name": name, "aten": aten, "status": "error" if name in errors else "ok",
               "samples_s": vals, "median_s": statistics.median(vals) if vals else None}
        if name in errors:
            rec["error"] = errors[name]
        if vals and base:
            rec["ratio_to_add"] = round(rec["median_s"] / base, 4)
        out.write(rec)
        print(f"[op_host] {name:14s} {rec['median_s'] and rec['median_s'] * 1e6 or float('nan'):8.2f} us  "
              f"x{rec.get('ratio_to_add', float('nan')):.2f}", flush=True)
    if args.decode_gemms:
        for rec in decode_gemms(device, dtype, args.repeats, count=4 if args.smoke else 40):
            out.write(rec)
            print(f"[op_host] {rec['name']:24s} issue {rec['median_s'] * 1e6:8.2f} us  x{rec['ratio_to_add']:.2f}  "
                  f"kernels {len(rec['kernels'] or [])}", flush=True)
    if measure_host:
        out.write(common.host_record("end"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
