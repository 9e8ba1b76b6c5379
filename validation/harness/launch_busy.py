"""Host cost of an eager kernel launch while the GPU is idle and while it is busy.

    python3 -m aisim.validation.harness.launch_busy --out OUT/launch-busy.jsonl [--smoke]

Why: eager decode steps of the H100/H200 suites with long kernels (Llama-3-8B decode 8 x 4096) took 14-17 ms where
the same model's host-bound steps (batch 1) took 19-20 ms, in every run: the host issued the same ops faster while
the GPU had work queued. This measures the host (CPU) time of issuing ``--launches`` small eager ops back to back,
without synchronizing, in two states of the GPU:

- ``idle``: the stream drained (synchronize) before the loop;
- ``busy``: a long kernel queued first (``torch.cuda._sleep`` for --busy-ms, or a large copy), so every launch of the
  loop lands behind queued work.

Ops (tiny tensors, so the GPU work itself stays negligible next to the launch): ``add`` (a + b, 1 x 256 fp16),
``mm`` (a 1 x 256 @ 256 x 256 fp16), ``view_add`` (a reshape and an add: one kernel, two aten calls), and
``tiny_layer``: a decode step of a 2-layer width-64 Llama (transformers, random weights, one token on a DynamicCache
of 16, then the cache cropped back): what a model's eager layers issue. Each row: op, state, launches per loop,
median host us per loop and per launch over --repeats loops, alternating idle and busy. The launches per loop stay
under the CUDA launch queue's depth (1024 entries) so no loop blocks on a full queue. Nothing here is a judged row.
"""
from __future__ import annotations

import statistics
import time

from . import common

SCRIPT = "launch_busy"
OPS = ("add", "mm", "view_add", "tiny_layer")


def make_op(name: str, device, dtype):
    """(a zero-argument call, aten kernel launches per call)."""
    import torch

    if name == "add":
        a, b = torch.randn(1, 256, device=device, dtype=dtype), torch.randn(1, 256, device=device, dtype=dtype)
        return (lambda: a + b), 1
    if name == "mm":
        a, w = torch.randn(1, 256, device=device, dtype=dtype), torch.randn(256, 256, device=device, dtype=dtype)
        return (lambda: a @ w), 1
    if name == "view_add":
        a = torch.randn(4, 64, device=device, dtype=dtype)
        return (lambda: a.reshape(1, 256) + 1.0), 1
    return _tiny_layer(device, dtype)


def _tiny_layer(device, dtype):
    import torch
    from transformers import DynamicCache

    config = common.hf_config("tiny-llama")
    model = common.build_causal_lm(config, dtype, device)
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        model(input_ids=torch.zeros(1, 16, dtype=torch.long, device=device), past_key_values=cache, use_cache=True)
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)

    def step():
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            cache.crop(-1)
    return step, None


def busy_kernel(device, busy_ms: float, how: str):
    """Queue about ``busy_ms`` of GPU work: one torch.cuda._sleep (cycles at ~1.98 GHz), or back-to-back clones of a
    1 GiB fp16 buffer (~0.7 ms each on H100/H200)."""
    import torch

    if how == "sleep":
        torch.cuda._sleep(int(busy_ms * 1.98e6))
        return
    if getattr(busy_kernel, "buf", None) is None:
        busy_kernel.buf = torch.empty(2 ** 29, device=device, dtype=torch.float16)
    for _ in range(max(1, round(busy_ms / 0.7))):
        busy_kernel.buf.clone()


def host_loop_us(call, calls: int, device, state: str, busy_ms: float, how: str) -> float:
    import torch

    torch.cuda.synchronize(device)
    if state == "busy":
        busy_kernel(device, busy_ms, how)
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    t = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize(device)
    return t


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "CPU: the loop only (no GPU states), one repeat")
    parser.add_argument("--launches", type=int, default=200, help="ops per timed loop (under the 1024-entry queue)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--busy-ms", type=float, default=20.0, help="length of the kernel queued before a busy loop")
    parser.add_argument("--busy-kinds", default="sleep,copy")
    parser.add_argument("--no-host", action="store_true", help="skip the host microbenchmark lines")
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
        args.repeats, args.launches = 1, 10
    out, budget, measure_host = common.start_run(SCRIPT, args, device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    for name in OPS:
        try:
            call, launches = make_op(name, device, dtype)
            for _ in range(5):
                call()
        except Exception as exc:  # noqa: BLE001 - recorded per op
            status, error = common.classify_error(exc)
            out.write({"type": "case", "op": name, "status": status, "error": error})
            continue
        calls = args.launches if launches else max(1, args.launches // 40)   # a tiny layer issues ~40 kernels
        if device.type != "cuda":
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            out.write({"type": "case", "op": name, "state": "cpu", "calls": calls, "status": "ok",
                       "host_us": round((time.perf_counter() - t0) * 1e6, 2)})
            continue
        for how in args.busy_kinds.split(","):
            samples: dict[str, list[float]] = {"idle": [], "busy": []}
            for _ in range(args.repeats):
                if budget.expired():
                    break
                for state in ("idle", "busy"):
                    samples[state].append(host_loop_us(call, calls, device, state, args.busy_ms, how))
            for state, values in samples.items():
                if not values:
                    continue
                med = statistics.median(values)
                rec = {"type": "case", "op": name, "state": state, "busy_kind": how, "calls": calls,
                       "status": "ok", "host_us_median": round(med, 2), "host_us_per_call": round(med / calls, 3),
                       "host_us": common.rounded(values, 2)}
                out.write(rec)
                print(f"[launch_busy] {name:10s} {how:5s} {state:4s}: {med / calls:8.3f} us per call "
                      f"({calls} calls)", flush=True)
    if measure_host:
        out.write(common.host_record("end"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
