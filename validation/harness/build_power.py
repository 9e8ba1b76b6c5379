"""GPU power while the host builds cuDNN SDPA graphs between kernels, against the GPU idle and a tight kernel loop.

    python3 -m aisim.validation.harness.build_power --out OUT/build-power.jsonl [--seconds 4] [--smoke]

transformers' continuous batching engine spends ~43 ms of host time per step whose attention shape is new
(cuDNN builds an execution graph; hardware_specs/runtimes/transformers-cb.yaml attention_graph_build_s) while the
GPU has nothing queued. aisim charges that time at the calibration's waiting power (active_power_w: the GPU
running tiny kernels back to back). This measures what the GPU draws then, with the NVML energy counter over a
window of ``--seconds``, in four loops taken in turn:
- ``build``: scaled_dot_product_attention (cuDNN backend, 32 queries, bf16, 12 heads x 128, an additive mask as
  the engine passes it) with a key count new at every call, synchronised after each call, as the engine's steps;
- ``repeat``: the same call at one key count (the graph cached), synchronised after each call;
- ``sleep``: the host sleeping 43 ms between tiny kernels (a gap with no host work on the GPU's side);
- ``idle``: no kernels at all.
One record per loop: calls, wall time per call, energy, average power. Not a judged case: a microbenchmark.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

from . import common

SCRIPT = "build_power"
Q, HEADS, HEAD_DIM, K0 = 32, 12, 128, 16384
GAP_S = 0.043


def _loops(device, torch):
    """name -> a function running one call of that loop."""
    F = torch.nn.functional
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(1, HEADS, Q, HEAD_DIM, device=device, dtype=dt)
    k = torch.randn(1, HEADS, K0 + 4096, HEAD_DIM, device=device, dtype=dt)
    v = torch.randn_like(k)
    mask = torch.zeros(1, 1, Q, K0 + 4096, device=device, dtype=dt)
    x = torch.zeros(1, device=device)
    state = {"n": K0}

    def sdpa(n):
        F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], attn_mask=mask[..., :n])
        common.sync(device)

    def build():
        state["n"] = state["n"] + 1 if state["n"] < K0 + 4095 else K0
        sdpa(state["n"])

    def sleep():
        x.add_(1.0)
        common.sync(device)
        time.sleep(GAP_S)

    return {"build": build, "repeat": lambda: sdpa(K0), "sleep": sleep, "idle": lambda: time.sleep(GAP_S)}


def main(argv: list[str] | None = None) -> int:
    parser = common.harness_parser(__doc__, "each loop for 0.3 s on the CPU (no energy counter)")
    parser.add_argument("--seconds", type=float, default=4.0, help="window per loop")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    device, out, budget, measure_host = common.open_run(SCRIPT, args)
    seconds = 0.3 if args.smoke else args.seconds
    def context():   # a fresh one per use: sdpa_kernel's context manager is single-use
        return (torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION)
                if device.type == "cuda" else nullcontext())
    loops = _loops(device, torch)
    for name in ("build", "repeat"):      # warm-up: cuDNN's first graph, the allocator
        with context():
            loops[name]()
    for round_ in range(1 if args.smoke else args.rounds):
        for name, call in loops.items():
            if budget.expired():
                out.write({"type": "stopped"})
                return common.close_run(out, measure_host)
            meter = common.EnergyWindow(device)
            with context():
                meter.start()
                t0, calls = time.perf_counter(), 0
                while time.perf_counter() - t0 < seconds:
                    call()
                    calls += 1
                wall = time.perf_counter() - t0
                energy = meter.stop()
            out.write({"type": "record", "round": round_, "loop": name, "calls": calls,
                       "wall_ms_per_call": round(wall / calls * 1e3, 4), **energy})
            print(f"{round_} {name}: {calls} calls, {wall / calls * 1e3:.2f} ms/call, {energy.get('avg_power_w')} W",
                  flush=True)
    return common.close_run(out, measure_host)


if __name__ == "__main__":
    raise SystemExit(main())
