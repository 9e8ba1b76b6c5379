"""Calibration microbenchmarks on the local GPU (CUDA events, NVML power): what to measure and how.

Each benchmark returns raw records (plain dicts) that calibrate_fit turns into a CalibrationSpec.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from ..units import TORCH_DTYPE_NAMES
from .calibrate_fit import (ATTN_BACKWARD_FLOPS_FACTOR, ATTN_DECODE_BATCH, ATTN_DECODE_KV, ATTN_DTYPES, ATTN_HEADS, ATTN_HEAD_DIMS, ATTN_PREFILL, ELEM_BYTES, GEMM_DTYPES, GEMM_M, GEMM_MAX_BYTES, GEMM_MAX_TIME_S, GEMM_NK, GEMM_QUICK, MEMORY_DTYPES, MEMORY_OPS, MEMORY_SIZES, TRANSPOSED_OPS, PHASE_DEADLINES, SLEEP_CYCLES_PER_S, attention_bytes, attention_flops, gemm_bytes, gemm_flops, roofline_time_s)

# ---------------------------------------------------------------- GPU timing

@dataclass
class Budget:
    """Wall-clock budget: each phase must end by its share of ``total_s`` (time unused passes on)."""
    total_s: float
    start: float

    def deadline(self, phase: str) -> float:
        return self.start + PHASE_DEADLINES[phase] * self.total_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def fits(self, phase: str, predicted_s: float) -> bool:
        return time.monotonic() + predicted_s <= self.deadline(phase)


def time_gpu_s(fns: list, *, target_s: float = 0.03, min_reps: int = 5, max_reps: int = 100) -> float:
    """Median GPU time (s) of one call, rotating through ``fns`` (one per input set); see module docstring.

    Where the GPU time of a call is not well above the CPU time to queue it, a sleep kernel long enough for
    the CPU to queue every rep (1.5x the measured queueing time, at most 0.2 s) goes first.
    """
    import torch

    fns[0]()
    torch.cuda.synchronize()
    warm = 3
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cpu_t0 = time.perf_counter()
    s.record()
    for i in range(warm):
        fns[(i + 1) % len(fns)]()
    e.record()
    cpu_s = (time.perf_counter() - cpu_t0) / warm        # CPU time to queue one call (and its events)
    torch.cuda.synchronize()
    est_s = s.elapsed_time(e) * 1e-3 / warm
    reps = max(min_reps, min(max_reps, int(target_s / max(est_s, 1e-7))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    if est_s < 4 * (cpu_s + 10e-6):
        torch.cuda._sleep(int(min(1.5 * reps * (cpu_s + 10e-6), 0.2) * SLEEP_CYCLES_PER_S))
    for r in range(reps):
        starts[r].record()
        fns[(warm + 1 + r) % len(fns)]()
        ends[r].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e-3 for a, b in zip(starts, ends))


def rotation_sets(set_bytes: float, l2_bytes: float, max_sets: int = 64) -> int:
    """How many input sets to rotate among: 1 if one set exceeds L2, else enough for ~3x L2 (at most max_sets)."""
    if set_bytes >= l2_bytes:
        return 1
    return max(2, min(max_sets, math.ceil(3 * l2_bytes / max(set_bytes, 1.0))))


def predicted_time_s(flops: float, nbytes: float, peak_flops_per_s: float, memory_bw_bytes_per_s: float) -> float:
    """A guess before measuring (for skipping and the time budget): roofline at 60 % of peak + 5 us."""
    return roofline_time_s(flops, nbytes, peak_flops_per_s, memory_bw_bytes_per_s) / 0.6 + 5e-6


# ---------------------------------------------------------------- plans (pure: what to measure, in what order)

def gemm_plan(quick: bool, peaks: dict, l2_bytes: float) -> tuple[list[dict], list[dict]]:
    """(shapes to measure, shapes skipped with the reason). Coarse grid points (every index even) come
    first, then the rest, each by increasing FLOPs, so that a short budget drops the fine and large ones."""
    ms, ns, ks = GEMM_QUICK if quick else (GEMM_M, GEMM_NK, GEMM_NK)
    todo, skipped = [], []
    for dtype in GEMM_DTYPES:
        for (i, m), (j, n), (l, k) in _product(enumerate(ms), enumerate(ns), enumerate(ks)):
            item = {"bench": "gemm", "dtype": dtype, "m": m, "n": n, "k": k}
            set_bytes = gemm_bytes(m, n, k, ELEM_BYTES[dtype])
            sets = rotation_sets(set_bytes, l2_bytes)
            t = predicted_time_s(gemm_flops(m, n, k), set_bytes, peaks["flops_per_s"][dtype],
                                 peaks["memory_bw_bytes_per_s"])
            if t > GEMM_MAX_TIME_S or set_bytes * sets > GEMM_MAX_BYTES:
                skipped.append({**item, "time_s": None, "skipped": f"predicted {t * 1e3:.0f} ms or "
                                f"{set_bytes * sets / 1e9:.1f} GB over the {GEMM_MAX_TIME_S * 1e3:.0f} ms / "
                                f"{GEMM_MAX_BYTES / 1e9:.0f} GB limit"})
                continue
            todo.append({**item, "sets": sets, "predicted_s": t, "level": int(any(x % 2 for x in (i, j, l)))})
    todo.sort(key=lambda it: (it["level"], gemm_flops(it["m"], it["n"], it["k"]), GEMM_DTYPES.index(it["dtype"])))
    return todo, skipped


def attention_plan(quick: bool) -> list[dict]:
    """Prefill (causal and not, forward and backward) and decode (q_len 1, forward) SDPA shapes."""
    prefill = ATTN_PREFILL[1:3] if quick else ATTN_PREFILL
    dims = ATTN_HEAD_DIMS[:1] if quick else ATTN_HEAD_DIMS
    kvs, batches = (ATTN_DECODE_KV[1:], ATTN_DECODE_BATCH[:2]) if quick else (ATTN_DECODE_KV, ATTN_DECODE_BATCH)
    items = []
    for dtype in ATTN_DTYPES:
        for d in dims:
            for direction in ("forward", "backward"):
                items += [{"bench": "attention", "dtype": dtype, "direction": direction, "batch": b,
                           "heads": ATTN_HEADS, "q_len": s, "kv_len": s, "head_dim": d, "causal": causal}
                          for b, s in prefill for causal in (True, False)]
            items += [{"bench": "attention", "dtype": dtype, "direction": "forward", "batch": b,
                       "heads": ATTN_HEADS, "q_len": 1, "kv_len": kv, "head_dim": d, "causal": False}
                      for kv in kvs for b in batches]
    return items


def memory_plan(quick: bool) -> list[dict]:
    sizes = MEMORY_SIZES[:-1:2] if quick else MEMORY_SIZES
    return [{"bench": "memory", "op": op, "dtype": dtype, "size_bytes": size}
            for size in sizes for dtype in MEMORY_DTYPES for op in MEMORY_OPS]


def transposed_plan(quick: bool) -> list[dict]:
    sizes = MEMORY_SIZES[2:-1:2] if quick else MEMORY_SIZES[2:]
    return [{"bench": "memory_t", "op": op, "dtype": dtype, "size_bytes": size}
            for size in sizes for dtype in MEMORY_DTYPES for op in TRANSPOSED_OPS]


def _transposed_call(torch, it: dict, dt):
    numel = it["size_bytes"] // ELEM_BYTES[it["dtype"]]
    h = min(1024, numel)
    x = torch.randn(numel // h, h, device="cuda", dtype=dt)
    if it["op"] == "add_t":
        y = torch.randn(h, numel // h, device="cuda", dtype=dt)
        return lambda: x.t() + y
    return lambda: x.t().contiguous()


def _product(*iterables):
    import itertools
    return itertools.product(*iterables)


# ---------------------------------------------------------------- GPU microbenchmarks



def _log(budget: Budget, msg: str) -> None:
    print(f"[{budget.elapsed():6.1f} s] {msg}", flush=True)


def _measure(item: dict, build, budget: Budget, phase: str, predicted_s: float, label: str) -> dict:
    """Time one item (``build()`` returns the callables to rotate among) or record why it was skipped."""
    import torch

    if not budget.fits(phase, predicted_s):
        return {**item, "time_s": None, "skipped": "time budget"}
    try:
        fns = build()
        t = time_gpu_s(fns)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as err:   # no kernel for this shape/dtype, or OOM
        torch.cuda.empty_cache()
        reason = (str(err).splitlines() or [type(err).__name__])[0][:300]
        _log(budget, f"{label}: skipped ({reason[:120]})")
        return {**item, "time_s": None, "skipped": reason}
    _log(budget, f"{label}: {t * 1e6:10.2f} us")
    return {**item, "time_s": t}


def bench_gemm(plan: list[dict], budget: Budget) -> list[dict]:
    """torch.matmul(x, W.t()) as nn.Linear: x (M, K), W (N, K); fp32 with TF32 off, tf32 with it on."""
    import torch

    out = []
    for it in plan:
        torch.backends.cuda.matmul.allow_tf32 = it["dtype"] == "tf32"
        dt = getattr(torch, TORCH_DTYPE_NAMES[it["dtype"]])

        def build(it=it, dt=dt):
            sets = [(torch.randn(it["m"], it["k"], device="cuda", dtype=dt),
                     torch.randn(it["n"], it["k"], device="cuda", dtype=dt)) for _ in range(it["sets"])]
            return [lambda x=x, w=w: torch.matmul(x, w.t()) for x, w in sets]

        label = f"gemm {it['dtype']:5s} m={it['m']:<6d} n={it['n']:<6d} k={it['k']:<6d}"
        rec = _measure(it, build, budget, "gemm", it["predicted_s"] * 12 + 0.01, label)
        out.append({k: v for k, v in rec.items() if k not in ("predicted_s", "level")})
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.empty_cache()
    return out


def bench_attention(plan: list[dict], budget: Budget, peaks: dict, l2_bytes: float) -> list[dict]:
    """F.scaled_dot_product_attention, (B, H, S, D) inputs, backend as PyTorch picks; TF32 off for fp32.
    Backward: torch.autograd.grad of one retained forward, so only the backward kernels are timed."""
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    out = []
    for it in plan:
        dt, bw = getattr(torch, TORCH_DTYPE_NAMES[it["dtype"]]), it["direction"] == "backward"
        shape = (it["batch"], it["heads"], it["q_len"], it["kv_len"], it["head_dim"])
        nbytes = attention_bytes(*shape, ELEM_BYTES[it["dtype"]], backward=bw)
        sets = rotation_sets(nbytes, l2_bytes, max_sets=16)
        flops = attention_flops(*shape, it["causal"]) * (ATTN_BACKWARD_FLOPS_FACTOR if bw else 1.0)
        guess = predicted_time_s(flops, nbytes, peaks["flops_per_s"][it["dtype"]], peaks["memory_bw_bytes_per_s"])

        def build(it=it, dt=dt, bw=bw, sets=sets):
            return [_sdpa_call(torch, F, it, dt, bw) for _ in range(sets)]

        label = (f"attention {it['dtype']} {it['direction'][:3]} b={it['batch']} sq={it['q_len']} "
                 f"skv={it['kv_len']} d={it['head_dim']} causal={int(it['causal'])}")
        out.append(_measure({**it, "rotation_sets": sets}, build, budget, "attention", guess * 20 + 0.02, label))
    torch.cuda.empty_cache()
    return out


def _sdpa_call(torch, F, it: dict, dt, backward: bool):
    b, h, d = it["batch"], it["heads"], it["head_dim"]
    q = torch.randn(b, h, it["q_len"], d, device="cuda", dtype=dt, requires_grad=backward)
    k = torch.randn(b, h, it["kv_len"], d, device="cuda", dtype=dt, requires_grad=backward)
    v = torch.randn(b, h, it["kv_len"], d, device="cuda", dtype=dt, requires_grad=backward)
    if not backward:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=it["causal"])
    o = F.scaled_dot_product_attention(q, k, v, is_causal=it["causal"])
    do = torch.randn_like(o)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


def bench_memory(plan: list[dict], budget: Budget, peaks: dict, l2_bytes: float) -> list[dict]:
    """Memory-bound kernels on (rows, min(4096, numel)) tensors: clone, a + b, gelu, silu, layer_norm,
    rms_norm (F.rms_norm) and softmax over the last dim; and (bench "memory_t") the same tensor read through its
    transpose (innermost dim strided): a copy to contiguous and an add with a contiguous operand (HF: a permuted
    conv output meeting a residual)."""
    import torch

    out = []
    for it in plan:
        dt = getattr(torch, TORCH_DTYPE_NAMES[it["dtype"]])
        transposed = it["bench"] == "memory_t"
        moved = (TRANSPOSED_OPS if transposed else MEMORY_OPS)[it["op"]] * it["size_bytes"]
        sets = rotation_sets(moved, l2_bytes)
        guess = predicted_time_s(0.0, moved, 1.0, peaks["memory_bw_bytes_per_s"])
        call = _transposed_call if transposed else _memory_call

        def build(it=it, dt=dt, sets=sets, call=call):
            return [call(torch, it, dt) for _ in range(sets)]

        label = f"{it['bench']} {it['op']:10s} {it['dtype']} {it['size_bytes'] / 2**20:10.3f} MiB"
        out.append(_measure({**it, "rotation_sets": sets}, build, budget, "memory",
                            guess * (400 if transposed else 120) + 0.01, label))
    torch.cuda.empty_cache()
    return out


def _memory_call(torch, it: dict, dt):
    import torch.nn.functional as F

    numel = it["size_bytes"] // ELEM_BYTES[it["dtype"]]
    h = min(4096, numel)
    x = torch.randn(numel // h, h, device="cuda", dtype=dt)
    w, bias = torch.randn(h, device="cuda", dtype=dt), torch.randn(h, device="cuda", dtype=dt)
    op = it["op"]
    if op == "add":
        y = torch.randn_like(x)
        return lambda: x + y
    return {"copy": lambda: x.clone(), "gelu": lambda: F.gelu(x), "silu": lambda: F.silu(x),
            "layer_norm": lambda: F.layer_norm(x, (h,), w, bias), "rms_norm": lambda: F.rms_norm(x, (h,), w),
            "softmax": lambda: torch.softmax(x, dim=-1)}[op]


def bench_overheads(repeats: int = 7, count: int = 2000, graph_kernels: int = 1000) -> list[dict]:
    """Tiny-kernel overheads, each repeated ``repeats`` times (the fit takes medians):
    graph_kernel_s = GPU time of a CUDA-graph replay of ``graph_kernels`` x.add_(1.0) / graph_kernels;
    eager_op_s = wall time of ``count`` eager x.add_(1.0) + one synchronize, / count;
    module_call_s / functional_call_s = the same for nn.Linear(64, 64) and F.linear on the same tensors."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(graph_kernels):
            x.add_(1.0)
    graph.replay()
    graph_s = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        graph_s.append(s.elapsed_time(e) * 1e-3 / graph_kernels)
    lin = torch.nn.Linear(64, 64, device="cuda")
    a = torch.randn(8, 64, device="cuda")
    w2 = torch.randn(64, 64, device="cuda")
    calls = {"eager_op_s": lambda: x.add_(1.0), "module_call_s": lambda: lin(a),
             "functional_call_s": lambda: F.linear(a, lin.weight, lin.bias),
             # known (python calls, kernels, views) per call, for the eager dispatch fit (DISPATCH_MIX)
             "view_call_s": lambda: a.view(-1), "linear_nobias_s": lambda: F.linear(a, w2),
             "t_contiguous_s": lambda: a.t().contiguous(), "add_out_s": lambda: torch.add(a, a)}
    samples = {name: [] for name in calls}
    with torch.no_grad():
        for _ in range(repeats):            # interleaved, so that drift hits the module and F.linear alike
            for name, fn in calls.items():
                samples[name].append(_wall_per_call_s(torch, fn, count))
    return [{"bench": "overhead", "name": "graph_kernel_s", "samples_s": graph_s}] + [
        {"bench": "overhead", "name": name, "samples_s": vals} for name, vals in samples.items()]


def _wall_per_call_s(torch, fn, count: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / count


# ---------------------------------------------------------------- power (pynvml)

@dataclass
class PowerMeter:
    """NVML handle of CUDA device 0; average power from the energy counter, else from sampled power."""
    nvml: object
    handle: object
    method: str
    power_limit_w: float
    driver: str

    def average_w(self, seconds: float, work=None) -> float:
        """Average board power over ``seconds`` while ``work()`` (one batch of GPU work + sync) repeats.

        The energy counter advances in steps, so the window runs from one step to another (found by polling
        between batches): the error is one batch, not one counter period.
        """
        step = work if work is not None else (lambda: time.sleep(0.005))
        t_end = time.perf_counter() + (0.5 if work is not None else 0.0)     # ramp clocks and power first
        while time.perf_counter() < t_end:
            step()
        if not self.method.startswith("energy"):
            samples, t0 = [], time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                step()
                samples.append(self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3)
            return statistics.fmean(samples)
        e0, t0 = self._next_energy_step(step)
        while time.perf_counter() - t0 < seconds:
            step()
        e1, t1 = self._next_energy_step(step)
        return (e1 - e0) / (t1 - t0)

    def _next_energy_step(self, step, limit_s: float = 1.0) -> tuple[float, float]:
        """(energy J, time) just after the counter next changes, running ``step`` meanwhile."""
        first, t_stop = self._energy_j(), time.perf_counter() + limit_s
        while time.perf_counter() < t_stop:
            step()
            now = self._energy_j()
            if now != first:
                return now, time.perf_counter()
        return self._energy_j(), time.perf_counter()

    def _energy_j(self) -> float:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3    # mJ -> J


def open_power_meter() -> PowerMeter | None:
    """None (power not measured, the fit then uses the default rules) when pynvml or NVML is unavailable."""
    from .gpu import driver_version, nvml_handle

    handle = nvml_handle(0)          # CUDA device 0, matched by UUID
    if handle is None:
        print("power: not measured (no NVML); install aisim[validate] for pynvml", flush=True)
        return None
    import pynvml

    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        method = "energy counter (nvmlDeviceGetTotalEnergyConsumption) difference / wall time"
    except pynvml.NVMLError:
        method = "mean of nvmlDeviceGetPowerUsage samples"
    return PowerMeter(pynvml, handle, method, pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3,
                      driver_version() or "unknown")


def bench_power(meter: PowerMeter, load: str, seconds: float) -> dict:
    """load 'idle' (nothing running), 'compute' (8192^3 bf16 GEMMs), 'memory' (1 GiB bf16 copies) or 'active'
    (back-to-back tiny kernels from eager PyTorch: the GPU clocked up but nearly idle, as between the small
    kernels of a CPU-bound step)."""
    import torch

    work = None
    if load == "compute":
        a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        c = torch.empty_like(a)
        work = lambda: ([torch.matmul(a, b, out=c) for _ in range(8)], torch.cuda.synchronize())   # noqa: E731
    elif load == "memory":
        src = torch.randn(2**29, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        work = lambda: ([dst.copy_(src) for _ in range(8)], torch.cuda.synchronize())   # noqa: E731
    elif load == "active":
        x = torch.randn(1, device="cuda")
        work = lambda: ([x.add_(1.0) for _ in range(2000)], torch.cuda.synchronize())   # noqa: E731
    watts = meter.average_w(seconds, work)
    return {"bench": "power", "load": load, "avg_power_w": watts, "duration_s": seconds, "method": meter.method}


POWER_CURVE_GEMM_SIDES = (512, 1024, 2048, 4096)          # bf16 square GEMMs below the 8192^3 reference load
POWER_CURVE_COPY_BYTES = (64 * 2**20, 256 * 2**20)         # copies below the 1 GiB reference load


def bench_power_curve(meter: PowerMeter, seconds: float, peaks: dict) -> list[dict]:
    """Power at intermediate loads: square bf16 GEMMs and copies of several sizes, each looped for ``seconds``.
    ``activity`` is the fraction of the datasheet peak (FLOP/s or bandwidth) the loop achieved."""
    import torch

    records = []
    for kind, sizes in (("compute", POWER_CURVE_GEMM_SIDES), ("memory", POWER_CURVE_COPY_BYTES)):
        for size in sizes:
            if kind == "compute":
                a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                c = torch.empty_like(a)
                reps = max(8, int(2**33 // size**3))
                fn = lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)   # noqa: E731
                work_units = 2.0 * size**3 / peaks["flops_per_s"]["bf16"]
            else:
                src = torch.randn(size // 2, device="cuda", dtype=torch.bfloat16)
                dst = torch.empty_like(src)
                reps = max(8, int(2**31 // size))
                fn = lambda src=src, dst=dst: dst.copy_(src)   # noqa: E731
                work_units = 2.0 * size / peaks["memory_bw_bytes_per_s"]
            counter = {"n": 0}

            def work(fn=fn, reps=reps, counter=counter):
                for _ in range(reps):
                    fn()
                torch.cuda.synchronize()
                counter["n"] += reps

            t0 = time.perf_counter()
            watts = meter.average_w(seconds, work)
            per_op_s = (time.perf_counter() - t0) / max(counter["n"], 1)
            records.append({"bench": "power_curve", "kind": kind, "size": size, "avg_power_w": watts,
                            "activity": min(work_units / per_op_s, 1.0)})
    return records

