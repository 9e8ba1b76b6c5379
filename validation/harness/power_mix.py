"""GPU power of mixed kernel sequences against the power of each kernel looped alone.

    python3 -m aisim.validation.harness.power_mix --out OUT/power-mix.jsonl [--seconds 3] [--rounds 2] [--smoke]

aisim prices each kernel's power from calibration loops of one kind of kernel (a GEMM loop, a copy loop) at the
fraction of peak it achieves, and a step's power is the time-weighted mean of its kernels'. A model step interleaves
GEMMs with elementwise kernels; if the GPU's power does not follow each kernel (clocks, voltage and temperature
settle over milliseconds), the elementwise kernels between GEMMs draw more than they do looped alone. This times
generic loads (bf16, shapes of no judged model), alone and interleaved, each for ``--seconds`` on the NVML energy
counter, with the kernels' own times from CUDA events:
- ``gemm``: 8192^3 mm (~1.4 ms on an H100), ``gemm_small``: 4096^3 (~0.2 ms);
- ``add``: two 128M-element tensors (768 MiB moved, ~0.3 ms), ``add_small``: 8M elements (48 MiB, ~20 us);
- ``copy``: a 512 MiB clone.
Sequences: each alone, then [gemm, add], [gemm, add x 3], [gemm_small, add], [gemm_small, add x 3],
[gemm_small, add_small x 4], [gemm, copy x 2], and (from the third run on) [gemm_small, add x 2],
[gemm_small, add x 6], [gemm_small, copy x 2], [gemm, add x 12]: GEMM time shares from 11% to 86%. Records: ``{"type": "sequence", "round", "name", "parts": [...],
"iterations", "ms_per_iteration", "energy_j", "energy_window_s", "avg_power_w", "sm_clock_mhz" (one reading after
the window), "busy_sm_clock_mhz" (mean of readings taken while the queue held work; in the runs made after power-mix-h200.jsonl),
"busy_sm_clock_range_mhz", "busy_clock_samples", "clock_event_reasons" (NVML's, ORed over those readings)}``.
``--skinny`` instead loops weight-streaming GEMMs x[M, K] @ w[K, N] (bf16, w of 112-128 MiB, past the L2 cache)
at M = 1 .. 4096 rows, each alone, then the reference loads (``gemm``, ``copy``) and one layer-like mix (an M = 128
GEMM between small adds): ``{"type": "skinny", "round", "name", "m", "k", "n", "parts", ...}`` as a sequence. A GEMM
of few rows keeps HBM near its bandwidth while its tensor cores work part of the time: how its power combines the
two activities is what the records measure (validation/scripts/derive_power_overlap.py).
``--gaps`` instead launches one kernel per period (add_small every 0.04-3 ms, add and gemm_small every 0.4-3 ms) with
the host spinning in between, as an eager step bound by its host does: ``{"type": "gapped", "round", "part",
"launches", "period_ms", "wall_s", "energy_j", ..., "avg_power_w"}``. A microbenchmark: nothing here is a judged
case.
"""
from __future__ import annotations

import time

from . import common
from .. import gpu

SCRIPT = "power_mix"
SEQUENCES = {"gemm": ["gemm"], "gemm_small": ["gemm_small"], "add": ["add"], "add_small": ["add_small"],
             "copy": ["copy"], "gemm+add": ["gemm", "add"], "gemm+3add": ["gemm", "add", "add", "add"],
             "gemm_small+add": ["gemm_small", "add"], "gemm_small+3add": ["gemm_small", "add", "add", "add"],
             "gemm_small+4add_small": ["gemm_small"] + ["add_small"] * 4, "gemm+2copy": ["gemm", "copy", "copy"],
             "gemm_small+2add": ["gemm_small", "add", "add"], "gemm_small+6add": ["gemm_small"] + ["add"] * 6,
             "gemm_small+2copy": ["gemm_small", "copy", "copy"], "gemm+12add": ["gemm"] + ["add"] * 12}


def loads(device, torch, smoke: bool) -> dict:
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    big, small = (64, 32) if smoke else (8192, 4096)
    n_add, n_small, n_copy = (4096, 1024, 8192) if smoke else (128 * 2**20, 8 * 2**20, 256 * 2**20)
    a, b = torch.randn(big, big, device=device, dtype=dt), torch.randn(big, big, device=device, dtype=dt)
    c, d = torch.randn(small, small, device=device, dtype=dt), torch.randn(small, small, device=device, dtype=dt)
    x, y = torch.randn(n_add, device=device, dtype=dt), torch.randn(n_add, device=device, dtype=dt)
    xs, ys = torch.randn(n_small, device=device, dtype=dt), torch.randn(n_small, device=device, dtype=dt)
    z = torch.randn(n_copy, device=device, dtype=dt)
    outs = {"gemm": torch.empty(big, big, device=device, dtype=dt),
            "gemm_small": torch.empty(small, small, device=device, dtype=dt),
            "add": torch.empty_like(x), "add_small": torch.empty_like(xs), "copy": torch.empty_like(z)}
    return {"gemm": lambda: torch.mm(a, b, out=outs["gemm"]),
            "gemm_small": lambda: torch.mm(c, d, out=outs["gemm_small"]),
            "add": lambda: torch.add(x, y, out=outs["add"]),
            "add_small": lambda: torch.add(xs, ys, out=outs["add_small"]),
            "copy": lambda: outs["copy"].copy_(z)}


# --skinny: (K, N) weight shapes (8192 x 8192: 128 MiB; 4096 x 14336: 112 MiB, an MLP's up projection) x rows M
SKINNY_KN = ((8192, 8192), (4096, 14336))
SKINNY_M = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def skinny_loads(device, torch, smoke: bool, kn=SKINNY_KN, dtype: str = "bf16") -> dict:
    """name -> (m, k, n, fn) for every skinny GEMM; the tensors are made once per (K, N) and largest M."""
    dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype]) if device.type == "cuda" else torch.float32
    shapes = ((64, 64),) if smoke else kn
    rows = (1, 8, 32) if smoke else SKINNY_M
    out = {}
    for k, n in shapes:
        w = torch.randn(k, n, device=device, dtype=dt)
        x = torch.randn(max(rows), k, device=device, dtype=dt)
        y = torch.empty(max(rows), n, device=device, dtype=dt)
        for m in rows:
            xm, ym = x[:m], y[:m]
            suffix = "" if dtype == "bf16" else f"_{dtype}"
            out[f"mm_M{m}_K{k}_N{n}{suffix}"] = (m, k, n, (lambda xm=xm, ym=ym, w=w: torch.mm(xm, w, out=ym)))
    return out


def run_sequence(parts, fns, device, seconds: float) -> dict:
    import torch

    calls = [fns[p] for p in parts]
    for fn in calls:        # warm
        fn()
    common.sync(device)
    meter = common.EnergyWindow(device)
    meter.start()
    cuda = device.type == "cuda"
    start = torch.cuda.Event(enable_timing=True) if cuda else None
    end = torch.cuda.Event(enable_timing=True) if cuda else None
    if cuda:
        start.record()
    t0, iterations = time.perf_counter(), 0
    clocks, reasons = [], 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            for fn in calls:
                fn()
        iterations += 8
        if meter.handle is not None and iterations % 16 == 8:   # the queue holds work: a reading of the busy GPU
            clocks.append(gpu.sm_clock_mhz(meter.handle))
            reasons |= gpu.clock_event_reasons(meter.handle) or 0
        if cuda and iterations % 64 == 0:
            end.record()
            end.synchronize()      # keep the queue shallow so the window's work is what the counter sees
    if cuda:
        end.record()
        end.synchronize()
        elapsed_ms = start.elapsed_time(end)
    else:
        elapsed_ms = (time.perf_counter() - t0) * 1e3
    clock = gpu.sm_clock_mhz(meter.handle) if meter.handle is not None else None
    energy = meter.stop()
    busy = [c for c in clocks if c]
    return {"iterations": iterations, "ms_per_iteration": round(elapsed_ms / iterations, 5), **energy,
            "sm_clock_mhz": clock, "busy_sm_clock_mhz": round(sum(busy) / len(busy), 1) if busy else None,
            "busy_sm_clock_range_mhz": [min(busy), max(busy)] if busy else None, "busy_clock_samples": len(busy),
            "clock_event_reasons": [name for bit, name in gpu.CLOCK_EVENT_REASONS.items() if reasons & bit]}


# --gaps: one kernel per period, the host spinning between launches (an eager host-bound step's pattern)
GAPS = {"add_small": (40e-6, 100e-6, 300e-6, 1e-3, 3e-3), "add": (0.5e-3, 1e-3, 3e-3),
        "gemm_small": (0.4e-3, 1e-3, 3e-3)}


def run_gapped(part: str, fns, device, period_s: float, seconds: float) -> dict:
    """``part`` launched once per ``period_s`` (the host spins until the next launch, never synchronising inside
    the window): the GPU runs it and waits the rest of the period."""
    fn = fns[part]
    fn()
    common.sync(device)
    meter = common.EnergyWindow(device)
    meter.start()
    t0 = time.perf_counter()
    launches = 0
    next_t = t0
    while next_t - t0 < seconds:
        fn()
        launches += 1
        next_t += period_s
        while time.perf_counter() < next_t:
            pass
    common.sync(device)
    wall = time.perf_counter() - t0
    clock = gpu.sm_clock_mhz(meter.handle) if meter.handle is not None else None
    energy = meter.stop()
    return {"launches": launches, "period_ms": round(period_s * 1e3, 4), "wall_s": round(wall, 4), **energy,
            "sm_clock_mhz": clock}


def main(argv: list[str] | None = None) -> int:
    parser = common.harness_parser(__doc__, "tiny loads for 0.2 s each on the CPU (no energy counter)")
    parser.add_argument("--seconds", type=float, default=3.0, help="window per sequence")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gaps", action="store_true", help="instead: one kernel per period, the host spinning "
                        "between launches (GAPS)")
    parser.add_argument("--skinny", action="store_true", help="instead: weight-streaming GEMMs of 1-4096 rows "
                        "(SKINNY_KN x SKINNY_M), the reference loads and a layer-like mix")
    parser.add_argument("--kn", default=None, help="with --skinny: weight shapes KxN,KxN (default SKINNY_KN)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="with --skinny: the GEMMs' dtype")
    args = parser.parse_args(argv)
    import torch

    device, out, budget, measure_host = common.open_run(SCRIPT, args)
    seconds = 0.2 if args.smoke else args.seconds
    with torch.inference_mode():
        fns = loads(device, torch, args.smoke)
        if args.skinny:
            kn = tuple(tuple(int(v) for v in x.split("x")) for x in args.kn.split(",")) if args.kn else SKINNY_KN
            skinny = skinny_loads(device, torch, args.smoke, kn, args.dtype)
            fns.update({name: fn for name, (_, _, _, fn) in skinny.items()})
            mix = next((n for n in skinny if n.startswith("mm_M128_")), next(iter(skinny)))
            runs = [(name, [name], skinny[name][:3]) for name in skinny]
            runs += [("gemm", ["gemm"], None), ("copy", ["copy"], None),
                     (f"{mix}+2add_small", [mix, "add_small", "add_small"], skinny[mix][:3])]
            for round_ in range(1 if args.smoke else args.rounds):
                for name, parts, mkn in runs:
                    if budget.expired():
                        out.write({"type": "stopped"})
                        return common.close_run(out, measure_host)
                    shape = {**dict(zip(("m", "k", "n"), mkn)), "dtype": args.dtype} if mkn else {}
                    rec = {"type": "skinny", "round": round_, "name": name, "parts": parts, **shape,
                           **run_sequence(parts, fns, device, seconds)}
                    out.write(rec)
                    print(f"{round_} {name}: {rec['ms_per_iteration']:.4f} ms/iter, {rec.get('avg_power_w')} W, "
                          f"{rec.get('busy_sm_clock_mhz')} MHz busy", flush=True)
            return common.close_run(out, measure_host)
        if args.gaps:
            for round_ in range(1 if args.smoke else args.rounds):
                for part, periods in GAPS.items():
                    for period in periods:
                        if budget.expired():
                            out.write({"type": "stopped"})
                            return common.close_run(out, measure_host)
                        rec = {"type": "gapped", "round": round_, "part": part,
                               **run_gapped(part, fns, device, period, seconds)}
                        out.write(rec)
                        print(f"{round_} {part} every {rec['period_ms']} ms: {rec.get('avg_power_w')} W, "
                              f"{rec.get('sm_clock_mhz')} MHz", flush=True)
            return common.close_run(out, measure_host)
        for round_ in range(1 if args.smoke else args.rounds):
            for name, parts in SEQUENCES.items():
                if budget.expired():
                    out.write({"type": "stopped"})
                    return common.close_run(out, measure_host)
                rec = {"type": "sequence", "round": round_, "name": name, "parts": parts,
                       **run_sequence(parts, fns, device, seconds)}
                out.write(rec)
                print(f"{round_} {name}: {rec['ms_per_iteration']:.4f} ms/iter, {rec.get('avg_power_w')} W, "
                      f"{rec.get('sm_clock_mhz')} MHz after, {rec.get('busy_sm_clock_mhz')} MHz busy "
                      f"{rec.get('busy_sm_clock_range_mhz')} {','.join(rec.get('clock_event_reasons') or [])}",
                      flush=True)
    return common.close_run(out, measure_host)


if __name__ == "__main__":
    raise SystemExit(main())
