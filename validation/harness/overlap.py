"""How an eager step's host work and GPU work overlap: wall time beside the host's issue time and the GPU's busy time.

    python3 -m aisim.validation.harness.overlap --out OUT/overlap.jsonl [--models a,b] [--cases 1x64,...] [--smoke]

Why: aisim walks an eager step as two queues (aisim.cost.timeline): the host issues each op, the GPU runs it once
issued. Where the two are balanced the step's time depends on how their work interleaves, layer by layer: about
max(host, GPU) if the GPU's backlog from one layer's GEMMs covers the next layer's host-bound ops, up to their sum
if it never does. This measures the three quantities on the same forward, in the same process:

- ``wall_ms``: synchronize, call, synchronize (median over --trials);
- decode cases (``dBxS``): one decode step of B sequences over a DynamicCache of S - 1 tokens, the cache cropped
  back and made contiguous after each trial, outside the timing (as validation/measure.py rewinds it, synchronized);
- ``host_ms`` and ``gpu_ms``: a ``torch.cuda._sleep`` of --sleep-ms is queued first, so the host issues the whole
  forward while the GPU is still asleep and never waits for it (the kernels per forward stay under the 1024-entry
  launch queue: 6 layers); ``host_ms`` is the host's time to issue the forward, ``gpu_ms`` the time between CUDA
  events recorded after the sleep and after the forward: the GPU's busy time with every kernel already queued.
  A step that makes a host sync (transformers 5.17's forward without cache does: the host time then includes the
  sleep) gets both wrong, so only its wall time is compared; the decode steps make none.

Models: validation/harness/configs/overlap-*.json, widths of their own (a Llama, a Qwen3-MoE with 64 experts of
512 top-6, a Mixtral with 8 experts top-2; 6 layers, random bf16 weights, grouped-GEMM experts as transformers picks
on a GPU); no judged dataset measures them. Cases: batch x tokens of a forward without cache (aisim --workload
forward), from host-bound (1 x 64) to GPU-bound (4 x 1024), and decode steps (aisim --workload decode --seq S).
One record per (model, case), flushed as measured.
"""
from __future__ import annotations

import statistics
import time

from . import common

SCRIPT = "overlap"
MODELS = ("overlap-llama", "overlap-qwen3moe", "overlap-mixtral")
SMOKE_WIDTHS = dict(num_hidden_layers=1, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512)
CASES = "1x64,1x256,1x512,1x1024,2x1024,4x1024,d1x128,d8x512,d32x512,d64x1024"


def _queued(forward, device, sleep_ms: float) -> tuple[float, float]:
    """(host ms to issue one forward, GPU ms between events around it) with the GPU asleep while the host issues."""
    import torch

    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(sleep_ms * 1.98e6))
    start.record()
    t0 = time.perf_counter()
    forward()
    host_ms = (time.perf_counter() - t0) * 1e3
    end.record()
    torch.cuda.synchronize(device)
    return host_ms, start.elapsed_time(end)


def _case(text: str) -> tuple[str, int, int]:
    """'BxT' -> (forward, B, T); 'dBxS' -> (decode, B, S)."""
    workload = "decode" if text.startswith("d") else "forward"
    batch, tokens = (int(v) for v in text.lstrip("d").split("x"))
    return workload, batch, tokens


def _step(model, config, workload: str, batch: int, tokens: int, device):
    """(the timed call, the untimed rewind after it): a forward without cache, or one decode step over a cache of
    tokens - 1 that the rewind crops back to that and makes contiguous (synchronized)."""
    import torch
    from transformers import DynamicCache

    if workload == "forward":
        ids = torch.randint(0, config.vocab_size, (batch, tokens), device=device)

        def forward():
            with torch.inference_mode():
                model(input_ids=ids, use_cache=False)
        return forward, lambda: None
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        model(input_ids=torch.randint(0, config.vocab_size, (batch, tokens - 1), device=device),
              past_key_values=cache, use_cache=True)
    new = torch.randint(0, config.vocab_size, (batch, 1), device=device)

    def step():
        with torch.inference_mode():
            model(input_ids=new, past_key_values=cache, use_cache=True)

    def rewind():
        cache.crop(-1)                      # transformers 5.17: crop(-n) removes the last n tokens
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
        common.sync(device)
        if cache.get_seq_length() != tokens - 1:
            raise RuntimeError(f"cache.crop left {cache.get_seq_length()} tokens, expected {tokens - 1}")
    return step, rewind


def _wall(forward, device) -> float:
    common.sync(device)
    t0 = time.perf_counter()
    forward()
    common.sync(device)
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "CPU: the first model, one tiny case, wall time only")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cases", default=CASES, help="BATCHxTOKENS, comma separated")
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--sleep-ms", type=float, default=150.0, help="GPU sleep queued before a host/GPU trial")
    parser.add_argument("--no-host", action="store_true", help="skip the host microbenchmark lines")
    args = parser.parse_args(argv)
    device, out, budget, measure_host = common.open_run(SCRIPT, args)
    import torch

    models = args.models.split(",")
    cases = [_case(c) for c in args.cases.split(",")]
    if args.smoke:
        models, cases, args.trials = models[:1], [("forward", 1, 8), ("decode", 2, 8)], 1
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for name in models:
        if budget.expired():
            break
        try:
            config = common.hf_config(name, **(SMOKE_WIDTHS if args.smoke else {}))
            model = common.build_causal_lm(config, dtype, device)
        except Exception as exc:  # noqa: BLE001 - recorded per model
            status, error = common.classify_error(exc)
            out.write({"type": "model", "model": name, "status": status, "error": error})
            continue
        out.write({"type": "model", "model": name, "status": "ok", "params": common.param_count(model),
                   "experts_implementation": getattr(model.config, "_experts_implementation", None),
                   "attn_implementation": model.config._attn_implementation})
        for workload, batch, tokens in cases:
            if budget.expired():
                break
            rec = {"type": "case", "model": name, "workload": workload, "batch": batch, "seq": tokens,
                   "dtype": "bf16" if device.type == "cuda" else "fp32"}
            try:
                forward, rewind = _step(model, config, workload, batch, tokens, device)
                for _ in range(3):
                    forward()
                    rewind()
                walls, hosts, gpus = [], [], []
                for _ in range(args.trials):       # interleaved: host drift hits both kinds of trial alike
                    walls.append(_wall(forward, device))
                    rewind()
                    if device.type == "cuda":
                        h, g = _queued(forward, device, args.sleep_ms)
                        rewind()
                        hosts.append(h)
                        gpus.append(g)
            except Exception as exc:  # noqa: BLE001 - recorded per case
                status, error = common.classify_error(exc)
                out.write({**rec, "status": status, "error": error})
                common.free_memory()
                continue
            rec.update(status="ok", wall_ms=round(statistics.median(walls), 4), wall_samples=common.rounded(walls))
            if hosts:
                rec.update(host_ms=round(statistics.median(hosts), 4), gpu_ms=round(statistics.median(gpus), 4),
                           host_samples=common.rounded(hosts), gpu_samples=common.rounded(gpus))
                print(f"[overlap] {name:18s} {batch}x{tokens:<5d} wall {rec['wall_ms']:8.2f}  host "
                      f"{rec['host_ms']:8.2f}  gpu {rec['gpu_ms']:8.2f}  wall/max "
                      f"{rec['wall_ms'] / max(rec['host_ms'], rec['gpu_ms']):.3f}", flush=True)
            out.write(rec)
        del model
        common.free_memory()
    return common.close_run(out, measure_host)


if __name__ == "__main__":
    raise SystemExit(main())
