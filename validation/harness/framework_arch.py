"""Host time of HF's eager model code per architecture: tiny models of every shipped model_type, interleaved.

    python3 -m aisim.validation.harness.framework_arch --out OUT/framework-arch.jsonl [--rounds 8] [--smoke]

Each architecture's tiny model (validation/framework_overhead.py tiny_architectures: width 64, 4 layers, its own
model class, flags, expert count and top-k; never a judged model) does almost no GPU work, so the wall time of its
step is the host cost of its Python model code, the dispatcher and the launches. Per round, every model in turn
(the order rotated each round, so host drift and position hit them alike) times ``DECODE_STEPS`` calls of each phase
of framework_overhead._phase_timers: a forward of 1 x 8 tokens, a decode step over a DynamicCache, and a
forward-backward with the loss (dense models only). bf16 weights for all (the grouped-GEMM experts path needs it);
SDPA where the architecture has it. One record per (round, architecture, phase), flushed as measured, plus a plain
add loop per round (the unit of the per-op host table).

What it is for: the calibration's eager_framework_scale is the median over four tiny families (llama, opt, gpt2,
bloom) of measured / predicted host time; the architectures' own ratios differ around it (HF's Python between the
ops is the model file's). validation/scripts/derive_framework_arch.py turns these records into
``eager_framework_arch_scale``: per model_type and phase, its ratio over the median of the four families in the same
round, median over the rounds.
"""
from __future__ import annotations

import time

from . import common

SCRIPT = "framework_arch"
ADD_CALLS = 2000


def _add_s(device) -> float:
    """Wall time of one eager torch.add of two small tensors (ADD_CALLS back to back + one sync)."""
    import torch

    a = torch.randn(8, 64, device=device)
    common.sync(device)
    t0 = time.perf_counter()
    for _ in range(ADD_CALLS):
        torch.add(a, a)
    common.sync(device)
    return (time.perf_counter() - t0) / ADD_CALLS


def _moe(config: dict) -> bool:
    return any(config.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def main(argv: list[str] | None = None) -> int:
    parser = common.harness_parser(__doc__, "one round on the CPU, fp32")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--only", default=None, help="comma-separated model_types (default: all)")
    args = parser.parse_args(argv)
    import torch

    from ..framework_overhead import BATCH, SEQ, _phase_timers, _tiny_model, tiny_architectures

    device, out, budget, measure_host = common.open_run(SCRIPT, args)
    archs = tiny_architectures()
    if args.only:
        unknown = sorted(set(args.only.split(",")) - set(archs))
        if unknown:
            parser.error(f"--only: unknown model_type(s) {unknown}; known: {sorted(archs)}")
        archs = {t: archs[t] for t in args.only.split(",")}
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    sync = (lambda: common.sync(device))
    timers = {}
    for arch, config in archs.items():
        try:
            model = _tiny_model(config, device.type, dtype)
            ids = torch.randint(0, 1000, (BATCH, SEQ), device=device)
            timers[arch] = _phase_timers(model, ids, sync, backward=not _moe(config))
            out.write({"type": "config", "arch": arch, "config": config,
                       "experts_implementation": getattr(model.config, "_experts_implementation", None),
                       "attn_implementation": getattr(model.config, "_attn_implementation", None)})
            for fn in timers[arch].values():   # warm-up: two calls of each phase
                fn()
                fn()
        except Exception as exc:  # noqa: BLE001 - one architecture that fails to build must not stop the others
            status, error = common.classify_error(exc)
            timers.pop(arch, None)
            out.write({"type": "record", "bench": "framework_arch", "arch": arch, "status": status, "error": error})
            print(f"{arch}: {status} {error[:200]}", flush=True)
    names = list(timers)
    t_start = time.perf_counter()
    rounds = 1 if args.smoke else args.rounds
    for round_ in range(rounds):
        if budget.expired():
            out.write({"type": "stopped", "round": round_})
            break
        out.write({"type": "record", "round": round_, "bench": "add", "time_s": _add_s(device)})
        shift = round_ % max(len(names), 1)
        for arch in names[shift:] + names[:shift]:
            for phase, fn in timers[arch].items():
                t = fn()
                out.write({"type": "record", "round": round_, "bench": "framework_arch", "arch": arch,
                           "phase": phase, "dtype": str(dtype).removeprefix("torch."), "time_s": t,
                           "status": "ok"})
        print(f"round {round_} done at {time.perf_counter() - t_start:.0f} s", flush=True)
    return common.close_run(out, measure_host)


if __name__ == "__main__":
    raise SystemExit(main())
