"""A decode step's weight GEMMs replayed from one CUDA graph, as a serving engine runs them.

    python3 -m aisim.validation.harness.graph_gemv --out OUT/graph-gemv.jsonl [--models Meta-Llama-3-8B]
        [--batches 1,8,32,64] [--replays 20] [--repeats 5] [--smoke]

What aisim's decode bandwidth on GPUs it never measured rests on: a memory-bound GEMM costs a fixed time plus its
bytes at a fraction of the datasheet bandwidth (calibration gemm_memory_efficiency, measured back to back on an
eager stream), less the eager launch gap a graph replay does not pay (efficiency.graph_replay_credit_s). This
measures the thing itself on the GPU at hand: every linear layer of one decode step of the model (vLLM's merged
q/k/v and gate/up projections, one GEMM each, plus the LM head; distinct weights per layer, so nothing stays in L2)
captured once into a CUDA graph (M tokens x K @ K x N, bf16, F.linear as vLLM's UnquantizedLinearMethod calls it)
and replayed ``replays`` times between two CUDA events, ``repeats`` rounds; the same sequence issued eagerly back
to back for comparison. Nothing here is a judged validation row: the shapes are the model's, the work is GEMMs only.
"""
from __future__ import annotations

import statistics

from . import common

SCRIPT = "graph_gemv"


def decode_gemms(name: str) -> list[tuple[int, int, int]]:
    """(K, N, layers) of the linear layers of one decode step, projections merged as vLLM loads them."""
    cfg = common.config_dict(name)
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    kv_heads = cfg.get("num_key_value_heads", heads)
    inter = cfg["intermediate_size"]
    return [(hidden, (heads + 2 * kv_heads) * head_dim, layers),   # qkv_proj
            (heads * head_dim, hidden, layers),                    # o_proj
            (hidden, 2 * inter, layers),                           # gate_up_proj
            (inter, hidden, layers),                               # down_proj
            (hidden, cfg["vocab_size"], 1)]                        # lm_head


def weight_bytes(gemms, itemsize: int = 2) -> int:
    return sum(k * n * count * itemsize for k, n, count in gemms)


def build_weights(gemms, device, dtype):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    return [[torch.randn(n, k, device=device, dtype=dtype, generator=g) * 0.02 for _ in range(count)]
            for k, n, count in gemms]


def step_fn(gemms, weights, m: int, device, dtype):
    """One decode step's GEMMs in layer order, inputs made once (the values do not change the time)."""
    import torch
    import torch.nn.functional as F

    xs = {k: torch.randn(m, k, device=device, dtype=dtype) for k, _, _ in gemms}
    layers = max(count for _, _, count in gemms)
    order = [(xs[k], ws[i]) for i in range(layers) for (k, _, count), ws in zip(gemms, weights) if i < count]

    def step():
        for x, w in order:
            F.linear(x, w)
    return step, len(order)


def time_graph_ms(step, replays: int, repeats: int, device) -> tuple[list[float], list[float]]:
    """(graph replay ms per step samples, eager ms per step samples)."""
    import torch

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph_ms, eager_ms = [], []
    for _ in range(repeats):
        for fn, out in ((graph.replay, graph_ms), (step, eager_ms)):
            for _ in range(2):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(replays):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / replays)
    del graph
    return graph_ms, eager_ms


def time_cpu_ms(step, repeats: int) -> list[float]:
    import time

    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "a 2-layer hidden-64 model on the CPU, eager only")
    parser.add_argument("--models", default="Meta-Llama-3-8B,Qwen2.5-7B")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-host", action="store_true", help="skip the host microbenchmark lines")
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
        args.models, args.batches, args.repeats = "tiny-llama", "1,4", 2
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out, budget, measure_host = common.start_run(SCRIPT, args, device)
    with torch.inference_mode():
        for name in args.models.split(","):
            try:
                gemms = decode_gemms(name)
                weights = build_weights(gemms, device, dtype)
            except Exception as exc:  # noqa: BLE001 - recorded per model
                status, error = common.classify_error(exc)
                out.write({"type": "model", "model": name, "status": status, "error": error})
                if common.is_fatal_device_error(exc):
                    raise
                continue
            out.write({"type": "model", "model": name, "status": "ok", "gemms": [list(g) for g in gemms],
                       "weight_bytes": weight_bytes(gemms, torch.finfo(dtype).bits // 8)})
            for m in common.parse_ints(args.batches):
                if budget.expired():
                    break
                rec = {"type": "case", "model": name, "batch": m, "dtype": str(dtype).removeprefix("torch."),
                       "status": "ok"}
                try:
                    step, count = step_fn(gemms, weights, m, device, dtype)
                    rec["gemms_per_step"] = count
                    itemsize = torch.finfo(dtype).bits // 8
                    rec["bytes_per_step"] = weight_bytes(gemms, itemsize) + sum(
                        m * (k + n) * c * itemsize for k, n, c in gemms)
                    if device.type == "cuda":
                        graph_ms, eager_ms = time_graph_ms(step, args.replays, args.repeats, device)
                        rec.update(graph_ms=common.rounded(graph_ms, 4), eager_ms=common.rounded(eager_ms, 4),
                                   graph_median_ms=round(statistics.median(graph_ms), 4),
                                   eager_median_ms=round(statistics.median(eager_ms), 4))
                        props = torch.cuda.get_device_properties(device)
                        rec["gpu_sm_count"] = props.multi_processor_count
                    else:
                        rec["eager_ms"] = common.rounded(time_cpu_ms(step, args.repeats), 4)
                except Exception as exc:  # noqa: BLE001 - recorded per case
                    rec["status"], rec["error"] = common.classify_error(exc)
                    if common.is_fatal_device_error(exc):
                        out.write(rec)
                        raise
                    common.free_memory()
                out.write(rec)
                print(f"[graph_gemv] {name} M={m}: graph {rec.get('graph_median_ms', float('nan')):.3f} ms, "
                      f"eager {rec.get('eager_median_ms', float('nan')):.3f} ms ({rec['status']})", flush=True)
            del weights
            common.free_memory()
    if measure_host:
        out.write(common.host_record("end"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
