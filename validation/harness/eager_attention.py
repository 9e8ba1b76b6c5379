"""The decode ops of HF's explicit (eager) attention on a DynamicCache, one call at a time: the KV-cache concat
and the batched GEMMs Q K^T and P V (torch.bmm / torch.baddbmm).

    python3 -m aisim.validation.harness.eager_attention --out OUT/eager-attention.jsonl [--smoke]
        [--bh 32,128,512,2048] [--seqs 128,512,2048,8192] [--head-dims 64,128] [--rows 1,8] [--dtypes fp16,bf16]
        [--cat-batches 1,8,32,64] [--cat-seqs 128,512,1024,2048,4096]

Section ``bmm`` (rows with ``op`` qk_bmm, qk_baddbmm, pv_bmm):

What a model that HF runs with its explicit attention issues per layer (BLOOM: ``alibi.baddbmm(q, k^T)`` then
``torch.bmm(probs, v)``, modeling_bloom.py; the eager attention functions of other models: ``torch.matmul`` of the
same 3-D/4-D operands): batch x heads independent small GEMMs in one cuBLAS strided-batched call. At decode (one
query row) every batch entry is a GEMV over its own K or V block, so the call moves bh x seq x head_dim elements at
an arithmetic intensity of 1 FLOP/byte; aisim has priced such a call either as one dense GEMM of (bh x m) x n x k
(a calibration's GEMM table) or on the unbatched skinny-GEMM bandwidth rule (the default rules): neither was
measured for this kernel. This script measures it.

Layouts are the model's: q (bh, m, d) contiguous; k^T a transposed view of a contiguous (bh, s, d) cache block;
probs (bh, m, s); v (bh, s, d); for ``qk_baddbmm`` an (bh, 1, s) ALiBi bias broadcast over the rows, beta 1 and
alpha 1/sqrt(d) as BLOOM calls it. Timing: each call's operand set is copied until the copies exceed 3 x L2, the
calls cycle through the copies inside one CUDA graph (so a small call's time is its kernel's, not the host's
dispatch rate), the graph replayed --replays times per window, median over --windows windows. Each row: shape,
``bytes`` (operands read + result written once), ``flop``, ``median_ms``, achieved GB/s. A final profiler session
names the kernels of a few shapes.

Section ``cat`` (rows with ``op`` cat_contig, cat_strided, cat_strided_batch, crop_contiguous): DynamicCache's
update, ``torch.cat([cache, new], dim=-2)`` of a contiguous (batch, heads, seq, head_dim) cache with the step's new key
(batch, heads, 1, head_dim) as the model leaves it: contiguous (separate k/v projections: view + transpose of one
token is contiguous), ``cat_strided`` BLOOM's slice of its fused QKV (``fused_qkv.view(b, 1, h, 3, d)[..., 1, :]
.transpose(1, 2)``: heads 3 x head_dim apart), ``cat_strided_batch`` GPT-2's (``c_attn(x).split(...)`` then view +
transpose: batch rows 3 x hidden apart, contiguous at batch 1); ``crop_contiguous`` the validation harnesses'
untimed rewind between decode steps (validation/measure.py _decode, moe_bench): the cache of seq + 1 tokens cropped
to seq (a view with a gap per head row) and made contiguous (``bytes`` the same: the view read, the copy written).
PyTorch's CUDA cat takes its vectorized copy only when every input is contiguous
(aten/src/ATen/native/cuda/Shape.cu, cat_out_cuda); otherwise a strided copy kernel (CatArrayBatchedCopy) for the
whole output, the cache included. ``bytes`` = the inputs read + the output written. Same timing as the bmm section.

Nothing here is a judged validation row: a shape grid, random inputs.
"""
from __future__ import annotations

import math
import statistics

from . import common

SCRIPT = "eager_attention"
OPS = ("qk_bmm", "qk_baddbmm", "pv_bmm")
CAT_OPS = ("cat_contig", "cat_strided", "cat_strided_batch", "crop_contiguous")
CAT_HEADS, CAT_HEAD_DIM = 32, 128
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
MAX_ELEMENTS = 2 ** 29          # one K (or V) block of bh x s x d elements: 1 GiB in fp16
MAX_COPIES = 16


def operand_shapes(op: str, bh: int, m: int, s: int, d: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(a, b) of ``a @ b``: Q K^T is (bh, m, d) @ (bh, d, s); P V is (bh, m, s) @ (bh, s, d)."""
    return ((bh, m, d), (bh, d, s)) if op.startswith("qk") else ((bh, m, s), (bh, s, d))


def call_bytes(op: str, bh: int, m: int, s: int, d: int, itemsize: int) -> int:
    (_, am, ak), (_, _, bn) = operand_shapes(op, bh, m, s, d)
    elements = bh * (am * ak + ak * bn + am * bn) + (bh * s if op == "qk_baddbmm" else 0)
    return elements * itemsize


def call_flop(op: str, bh: int, m: int, s: int, d: int) -> int:
    return 2 * bh * m * s * d


def make_calls(op: str, bh: int, m: int, s: int, d: int, dtype, device, copies: int):
    """``copies`` operand sets and a zero-argument call on each, in the model's layouts."""
    import torch

    calls = []
    for _ in range(copies):
        if op.startswith("qk"):
            q = torch.randn(bh, m, d, device=device, dtype=dtype)
            kt = torch.randn(bh, s, d, device=device, dtype=dtype).transpose(1, 2)   # a cache block, viewed as K^T
            if op == "qk_bmm":
                calls.append(lambda q=q, kt=kt: torch.bmm(q, kt))
            else:
                bias = torch.randn(bh, 1, s, device=device, dtype=dtype)
                alpha = 1.0 / math.sqrt(d)
                calls.append(lambda q=q, kt=kt, bias=bias: bias.baddbmm(q, kt, beta=1.0, alpha=alpha))
        else:
            p = torch.randn(bh, m, s, device=device, dtype=dtype)
            v = torch.randn(bh, s, d, device=device, dtype=dtype)
            calls.append(lambda p=p, v=v: torch.bmm(p, v))
    return calls


def cat_calls(op: str, batch: int, s: int, dtype, device, copies: int):
    """``copies`` (cache, new) pairs and ``torch.cat([cache, new], dim=-2)`` on each, the new key laid out as the
    model leaves it (module docstring)."""
    import torch

    h, d = CAT_HEADS, CAT_HEAD_DIM
    calls = []
    for _ in range(copies):
        cache = torch.randn(batch, h, s, d, device=device, dtype=dtype)
        if op in ("cat_contig", "crop_contiguous"):
            new = torch.randn(batch, 1, h, d, device=device, dtype=dtype).transpose(1, 2)
        elif op == "cat_strided":
            new = torch.randn(batch, 1, h, 3, d, device=device, dtype=dtype)[..., 1, :].transpose(1, 2)
        else:
            new = torch.randn(batch, 1, 3 * h * d, device=device, dtype=dtype)[..., h * d:2 * h * d]
            new = new.view(batch, 1, h, d).transpose(1, 2)
        if op == "crop_contiguous":   # the harness's untimed rewind: DynamicCache.crop(-1), then .contiguous()
            grown = torch.cat([cache, new], dim=-2)
            calls.append(lambda grown=grown, s=s: grown[:, :, :s, :].contiguous())
        else:
            calls.append(lambda cache=cache, new=new: torch.cat([cache, new], dim=-2))
    return calls


def cat_bytes(batch: int, s: int, itemsize: int) -> int:
    return batch * CAT_HEADS * CAT_HEAD_DIM * (2 * s + 2) * itemsize


def time_graph_ms(calls, device, replays: int, windows: int) -> list[float]:
    """Per-call ms: the calls (cycled to >= 8 of them) captured in one CUDA graph, replayed ``replays`` times per
    event-timed window."""
    import torch

    seq = [calls[i % len(calls)] for i in range(max(8, len(calls)))]
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for fn in seq[:3]:
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in seq:
            fn()
    graph.replay()
    torch.cuda.synchronize(device)
    out = []
    for _ in range(windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / replays / len(seq))
    del graph
    return out


def measure(rec: dict, build, device, args, out) -> None:
    """Time ``build()``'s calls into ``rec`` (median_ms, min_ms, max_ms, gb_per_s) or record the error; write
    ``rec`` to ``out`` (before re-raising a CUDA error that poisons the process)."""
    try:
        calls = build()
        if device.type == "cuda":
            times = time_graph_ms(calls, device, args.replays, args.windows)
        else:
            times, _ = common.time_calls(calls, device, 5.0, args.windows)
        median = statistics.median(times)
        rec.update(median_ms=round(median, 6), min_ms=round(min(times), 6), max_ms=round(max(times), 6),
                   gb_per_s=round(rec["bytes"] / median / 1e6, 1))
    except Exception as exc:  # noqa: BLE001 - recorded per case
        rec["status"], rec["error"] = common.classify_error(exc)
        if common.is_fatal_device_error(exc):
            out.write(rec)
            raise
    calls = None
    common.free_memory(collect=rec["status"] != "ok")
    out.write(rec)


def shapes(args) -> list[tuple[str, int, int, int, int]]:
    """(phase, bh, m, s, d): decode rows (m in --rows) over the bh x seq x head_dim grid; prefill (m = s) on a
    smaller grid."""
    out = []
    for d in common.parse_ints(args.head_dims):
        for bh in common.parse_ints(args.bh):
            for s in common.parse_ints(args.seqs):
                if bh * s * d <= MAX_ELEMENTS:
                    out += [("decode", bh, m, s, d) for m in common.parse_ints(args.rows)]
        for bh in common.parse_ints(args.prefill_bh):
            for s in common.parse_ints(args.prefill_seqs):
                if bh * s * max(s, d) <= MAX_ELEMENTS:
                    out.append(("prefill", bh, s, s, d))
    return out


def profile_kernels(args, device, dtype) -> dict:
    """Kernel names and device us per call of a few shapes (one profiler session, after every timed case)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    picks = [("decode", 256, 1, 1024, 128), ("decode", 2048, 1, 2048, 128), ("decode", 32, 1, 128, 64),
             ("prefill", 256, 512, 512, 128)]
    out = {}
    for phase, bh, m, s, d in picks:
        for op in OPS:
            calls = make_calls(op, bh, m, s, d, dtype, device, 1)
            calls[0]()
            torch.cuda.synchronize(device)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    calls[0]()
                torch.cuda.synchronize(device)
            kernels: dict[str, float] = {}
            for name, us in common.device_events(prof):
                kernels[name] = kernels.get(name, 0.0) + us / 3
            out[f"{op}/{phase}/bh{bh}/m{m}/s{s}/d{d}"] = {k: round(v, 2) for k, v in kernels.items()}
    return out


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny shapes on the CPU, no graph (eager timing)")
    parser.add_argument("--bh", default="32,128,512,2048", help="batch x heads of a decode call")
    parser.add_argument("--seqs", default="128,512,2048,8192", help="cached tokens of a decode call")
    parser.add_argument("--rows", default="1,8", help="query rows of a decode call")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--prefill-bh", default="32,256")
    parser.add_argument("--prefill-seqs", default="128,512,2048")
    parser.add_argument("--dtypes", default="fp16,bf16")
    parser.add_argument("--cat-batches", default="1,8,32,64", help="batch of a KV-cache concat (32 heads x 128)")
    parser.add_argument("--cat-seqs", default="128,512,1024,2048,4096", help="cached tokens of a KV-cache concat")
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
        args.bh, args.seqs, args.rows, args.head_dims = "4", "16,32", "1", "8"
        args.prefill_bh, args.prefill_seqs, args.dtypes = "2", "16", "fp32"
        args.cat_batches, args.cat_seqs = "1,2", "16"
    out, budget, measure_host = common.start_run(SCRIPT, args, device)
    cuda = device.type == "cuda"
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size if cuda else 0
    with torch.inference_mode():
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, DTYPES[dtype_name])
            itemsize = torch.finfo(dtype).bits // 8
            for phase, bh, m, s, d in shapes(args):
                for op in OPS:
                    if budget.expired():
                        break
                    nbytes = call_bytes(op, bh, m, s, d, itemsize)
                    copies = min(MAX_COPIES, max(1, math.ceil(3 * l2_bytes / nbytes))) if cuda else 1
                    rec = {"type": "case", "section": "bmm", "op": op, "phase": phase, "bh": bh, "m": m, "s": s, "d": d,
                           "dtype": dtype_name, "bytes": nbytes, "flop": call_flop(op, bh, m, s, d),
                           "copies": copies, "status": "ok"}
                    measure(rec, lambda: make_calls(op, bh, m, s, d, dtype, device, copies), device, args, out)
                    print(f"[eager_attention] {dtype_name} {op} {phase} bh={bh} m={m} s={s} d={d}: "
                          f"{rec.get('median_ms', float('nan')):.4f} ms {rec.get('gb_per_s', 0):.0f} GB/s "
                          f"({rec['status']})", flush=True)
            for batch in common.parse_ints(args.cat_batches):
                for s in common.parse_ints(args.cat_seqs):
                    for op in CAT_OPS:
                        if budget.expired():
                            break
                        nbytes = cat_bytes(batch, s, itemsize)
                        copies = min(MAX_COPIES, max(1, math.ceil(3 * l2_bytes / nbytes))) if cuda else 1
                        rec = {"type": "case", "section": "cat", "op": op, "batch": batch, "heads": CAT_HEADS,
                               "s": s, "d": CAT_HEAD_DIM, "dtype": dtype_name, "bytes": nbytes, "copies": copies,
                               "status": "ok"}
                        measure(rec, lambda: cat_calls(op, batch, s, dtype, device, copies), device, args, out)
                        print(f"[eager_attention] {dtype_name} {op} batch={batch} s={s}: "
                              f"{rec.get('median_ms', float('nan')):.4f} ms {rec.get('gb_per_s', 0):.0f} GB/s "
                              f"({rec['status']})", flush=True)
        if cuda and budget.allows(10):
            try:
                out.write({"type": "kernels", "dtype": args.dtypes.split(",")[0],
                           "kernels": profile_kernels(args, device, getattr(torch, DTYPES[args.dtypes.split(",")[0]]))})
            except Exception as exc:  # noqa: BLE001 - the timed rows matter more
                out.write({"type": "kernels", "status": "error", "error": common.classify_error(exc)[1]})
    if measure_host:
        out.write(common.host_record("end"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
