"""`aisim calibrate`: microbenchmarks on the local GPU that write a calibration file (CalibrationSpec YAML).

The cost model's convention, followed exactly: for every op

    t_roofline = max(flops / peak_flops_datasheet[dtype], bytes / memory_bw_datasheet)
    efficiency = t_roofline / t_measured        (the estimate is then t_roofline / efficiency)

with bytes = each input read once + each output written once, and a multiply-add = 2 FLOPs
(GEMM M x K @ K x N = 2*M*N*K; attention formulas in ``attention_flops``).

Measurement and fitting are kept apart. The benchmarks (GPU, this module's second half) produce plain
records, saved next to the YAML as ``<stem>.raw.json``; ``fit_calibration(raw)`` and the functions above it
are pure (plain lists in, numbers out), so curves can be refit on a CPU:
``python -m aisim.validation.calibrate --refit X.raw.json --out X.yaml``.

Timing: one untimed call, a timed warm-up, then ``reps`` calls each between two CUDA events; the median.
A ``torch.cuda._sleep`` kernel is queued first for short ops, so the CPU enqueues every rep while the GPU
waits and the events time GPU work, not Python dispatch. Inputs are random normal (never zeros); where one
set of inputs fits in L2, the calls rotate among several sets (about 3x L2 in all) so reads come from HBM.

Known inaccuracies: efficiencies above 1 are kept (a datasheet peak can be beaten, e.g. by L2 hits on tiny
ops); the rotation does not flush L2 of the output; power is one steady-state average per load, not a model.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import AisimError, UnknownNameError
from ..formulas import FLASH_BACKWARD_FLOPS_RATIO
from ..formulas import attention_flops as _formula_attention_flops
from ..graph.ops import TensorMeta
from ..specs import CalibrationSpec, Curve, GemmTable

# ---------------------------------------------------------------- conventions and grids (documented constants)

GEMM_DTYPES = ("fp32", "tf32", "fp16", "bf16")
GEMM_M = (1, 8, 32, 128, 512, 2048, 8192, 32768)
GEMM_NK = (512, 2048, 8192, 32768)
GEMM_QUICK = ((1, 512, 8192), (2048, 8192), (2048, 8192))     # the 3x2x2 grid of quick mode
GEMM_MAX_TIME_S = 0.050          # skip a GEMM whose predicted time exceeds this
GEMM_MAX_BYTES = 8e9             # skip a GEMM whose tensors (all rotation sets) exceed this
ATTN_DTYPES = ("fp16", "bf16", "fp32")
ATTN_HEADS = 32
ATTN_HEAD_DIMS = (128, 64)
ATTN_PREFILL = ((1, 128), (1, 512), (4, 1024), (16, 1024), (1, 4096), (8, 2048))    # (batch, seq)
ATTN_DECODE_KV = (128, 1024, 4096)
ATTN_DECODE_BATCH = (1, 8, 64)
ATTN_BACKWARD_FLOPS_FACTOR = FLASH_BACKWARD_FLOPS_RATIO   # 2.5: flash backward, 5 matmuls to the forward's 2
MEMORY_DTYPES = ("fp16", "fp32")
# tensors of the input's size that each op reads + writes (bytes moved = this x input bytes)
MEMORY_OPS = {"copy": 2, "add": 3, "gelu": 2, "silu": 2, "layer_norm": 2, "rms_norm": 2, "softmax": 2}
MEMORY_SIZES = tuple(4096 * 4**i for i in range(10)) + (2 * 2**30,)     # input bytes, 4 KiB .. 2 GiB
SLEEP_CYCLES_PER_S = 2.0e9       # torch.cuda._sleep counts SM cycles; ~H100/H200 boost (1.98 GHz); slower = longer
CURVE_BIN_DECADES = 0.5          # curves: median efficiency in bins of half a decade of log10(size)
ELEM_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
# share of max_minutes by which each phase must have finished (unused time passes to the next phase)
PHASE_DEADLINES = {"gemm": 0.45, "attention": 0.68, "memory": 0.80, "collectives": 0.95}


# ---------------------------------------------------------------- pure formulas

def gemm_flops(m: int, n: int, k: int) -> float:
    """(M x K) @ (K x N): M*N*K multiply-adds = 2*M*N*K FLOPs."""
    return 2.0 * m * n * k


def gemm_bytes(m: int, n: int, k: int, elem_bytes: float) -> float:
    """x (M x K) and W (N x K) read once, out (M x N) written once."""
    return float(m * k + n * k + m * n) * elem_bytes


def attention_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int, causal: bool) -> float:
    """SDPA forward FLOPs by the cost model's own formula (aisim.formulas.attention_flops, written once):
    4*B*H*Sq*Skv*D; causal counts the attended pairs with the mask aligned bottom-right, Sq*(Skv-Sq) +
    Sq*(Sq+1)/2, i.e. Sq*(Sq+1)/2 for Sq == Skv and all Skv keys for a decode step (Sq = 1)."""
    q = TensorMeta((batch, heads, q_len, head_dim), "fp16")
    kv = TensorMeta((batch, heads, kv_len, head_dim), "fp16")
    return _formula_attention_flops(q, kv, kv, causal)


def attention_bytes(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int, elem_bytes: float,
                    backward: bool = False) -> float:
    """Forward: q, k, v read once, output written once. Backward: q, k, v, out, dout read, dq, dk, dv written."""
    q_sized, kv_sized = (4, 4) if backward else (2, 2)
    return float(batch * heads * head_dim * (q_sized * q_len + kv_sized * kv_len)) * elem_bytes


def roofline_time_s(flops: float, nbytes: float, peak_flops_per_s: float, memory_bw_bytes_per_s: float) -> float:
    """max(flops / peak, bytes / bandwidth): the convention every efficiency here is measured against."""
    return max(flops / peak_flops_per_s, nbytes / memory_bw_bytes_per_s)


def efficiency(flops: float, nbytes: float, time_s: float, peak_flops_per_s: float,
               memory_bw_bytes_per_s: float) -> float:
    return roofline_time_s(flops, nbytes, peak_flops_per_s, memory_bw_bytes_per_s) / time_s


# ---------------------------------------------------------------- pure fitting

def binned_curve(sizes: list[float], effs: list[float], bin_decades: float = CURVE_BIN_DECADES) -> Curve:
    """Median efficiency in bins of ``bin_decades`` of log10(size) (bin i = [i*w, (i+1)*w)).

    Each curve point sits at the median log10(size) of its bin, so x increases strictly.
    """
    if not sizes or len(sizes) != len(effs):
        raise ValueError("binned_curve needs equal, non-empty lists of sizes and efficiencies")
    bins: dict[int, list[tuple[float, float]]] = {}
    for size, eff in zip(sizes, effs):
        x = math.log10(size)
        bins.setdefault(math.floor(x / bin_decades + 1e-9), []).append((x, eff))
    keys = sorted(bins)
    return Curve(x=[round(statistics.median(p[0] for p in bins[b]), 4) for b in keys],
                 efficiency=[_sig(statistics.median(p[1] for p in bins[b])) for b in keys])


def grouped_curve(groups: list[float], sizes: list[float], effs: list[float]) -> Curve:
    """One point per group (e.g. the input size of a memory benchmark): median log10(size), median efficiency."""
    by: dict[float, list[tuple[float, float]]] = {}
    for g, size, eff in zip(groups, sizes, effs):
        by.setdefault(g, []).append((math.log10(size), eff))
    keys = sorted(by)
    xs = [round(statistics.median(p[0] for p in by[g]), 4) for g in keys]
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError("groups overlap in size: their median sizes do not increase")
    return Curve(x=xs, efficiency=[_sig(statistics.median(p[1] for p in by[g])) for g in keys])


def gemm_table(points: dict[tuple[int, int, int], float], m: list[int], n: list[int], k: list[int]
               ) -> tuple[GemmTable, list[str]]:
    """Efficiency on the full M x N x K grid; a grid point not measured takes its nearest measured neighbour.

    Distance is the L1 distance in grid indices; ties go to the first in (m, n, k) order. Returns the
    table and one line per filled point ("m=.. n=.. k=.. <- m=.. n=.. k=..").
    """
    measured = [(m.index(a), n.index(b), k.index(c), e) for (a, b, c), e in points.items()]
    if not measured:
        raise ValueError("gemm_table needs at least one measured point")
    filled, table = [], []
    for i, mi in enumerate(m):
        rows = []
        for j, nj in enumerate(n):
            cells = []
            for l, kl in enumerate(k):
                if (mi, nj, kl) in points:
                    cells.append(_sig(points[(mi, nj, kl)]))
                    continue
                near = min(measured, key=lambda p: (abs(p[0] - i) + abs(p[1] - j) + abs(p[2] - l), p[:3]))
                cells.append(_sig(near[3]))
                filled.append(f"m={mi} n={nj} k={kl} <- m={m[near[0]]} n={n[near[1]]} k={k[near[2]]}")
            rows.append(cells)
        table.append(rows)
    return GemmTable(m=list(m), n=list(n), k=list(k), efficiency=table), filled


def fit_gemm(records: list[dict], peaks: dict, grid: dict) -> tuple[dict, dict, list[str]]:
    """GEMM records -> (gemm_efficiency curves, gemm_tables, notes), per dtype measured."""
    curves, tables, notes = {}, {}, []
    for dtype in GEMM_DTYPES:
        rows = [r for r in records if r["bench"] == "gemm" and r["dtype"] == dtype and r.get("time_s")]
        if not rows:
            continue
        peak, bw = peaks["flops_per_s"][dtype], peaks["memory_bw_bytes_per_s"]
        pts = {(r["m"], r["n"], r["k"]): efficiency(gemm_flops(r["m"], r["n"], r["k"]),
                                                     gemm_bytes(r["m"], r["n"], r["k"], ELEM_BYTES[dtype]),
                                                     r["time_s"], peak, bw) for r in rows}
        curves[dtype] = binned_curve([gemm_flops(*s) for s in pts], list(pts.values()))
        tables[dtype], filled = gemm_table(pts, grid["m"], grid["n"], grid["k"])
        notes.append(f"gemm {dtype}: {len(pts)} shapes measured against peak {peak:.4g} FLOP/s"
                     + (f"; {len(filled)} grid points filled by nearest measured neighbour: "
                        + "; ".join(filled) if filled else ""))
    return curves, tables, notes


def fit_attention(records: list[dict], peaks: dict) -> tuple[dict, list[str]]:
    """Attention records -> curves keyed '<dtype>' (prefill forward, vs log10 FLOPs), '<dtype>-backward'
    (prefill backward, FLOPs = 2.5x forward) and '<dtype>-decode' (q_len 1, vs log10 bytes)."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in records:
        if r["bench"] != "attention" or not r.get("time_s"):
            continue
        shape = (r["batch"], r["heads"], r["q_len"], r["kv_len"], r["head_dim"])
        backward = r["direction"] == "backward"
        flops = attention_flops(*shape, r["causal"]) * (ATTN_BACKWARD_FLOPS_FACTOR if backward else 1.0)
        nbytes = attention_bytes(*shape, ELEM_BYTES[r["dtype"]], backward=backward)
        eff = efficiency(flops, nbytes, r["time_s"], peaks["flops_per_s"][r["dtype"]],
                         peaks["memory_bw_bytes_per_s"])
        decode = r["q_len"] == 1
        key = r["dtype"] + ("-decode" if decode else "") + ("-backward" if backward else "")
        xs, es = series.setdefault(key, ([], []))
        xs.append(nbytes if decode else flops)
        es.append(eff)
    curves = {key: binned_curve(*series[key]) for key in sorted(series)}
    notes = [f"attention {key}: {len(series[key][0])} shapes" for key in sorted(series)]
    return curves, notes


def fit_memory(records: list[dict], memory_bw_bytes_per_s: float) -> tuple[Curve, dict[str, Curve], list[str]]:
    """Memory-bound records -> one curve (median over kinds and dtypes at each input size, x = log10 of the
    median bytes moved) and per-op curves for the raw file. FLOPs are ignored (bytes / bw dominates)."""
    rows = [r for r in records if r["bench"] == "memory" and r.get("time_s")]
    if not rows:
        raise ValueError("no memory-bound measurements to fit")
    moved = [MEMORY_OPS[r["op"]] * r["size_bytes"] for r in rows]
    effs = [b / memory_bw_bytes_per_s / r["time_s"] for b, r in zip(moved, rows)]
    curve = grouped_curve([r["size_bytes"] for r in rows], moved, effs)
    per_op = {}
    for op in sorted({r["op"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["op"] == op]
        per_op[op] = grouped_curve([rows[i]["size_bytes"] for i in idx], [moved[i] for i in idx],
                                   [effs[i] for i in idx])
    return curve, per_op, [f"memory: {len(rows)} (op, dtype, size) points, ops {sorted(per_op)}"]


# Python-level torch calls, kernel-launching aten ops and view aten ops that one call of each benchmark makes
# (as aisim's tracer counts them): a.view(-1) = 1 call + 1 view; x.add_(1) = 1 call + 1 kernel;
# F.linear(a, w) = 1 call + t (view) + mm (kernel); a.t().contiguous() = 2 calls + t (view) + clone (kernel);
# torch.add(a, a) = 1 call + 1 kernel (allocating its output).
DISPATCH_MIX = {"view_call_s": (1, 0, 1), "eager_op_s": (1, 1, 0), "linear_nobias_s": (1, 1, 1),
                "t_contiguous_s": (2, 1, 1), "add_out_s": (1, 1, 0)}


def fit_dispatch(med: dict[str, float]) -> dict[str, float]:
    """Least squares of wall time per call = calls * P + kernels * K + views * V over DISPATCH_MIX (non-negative)."""
    import numpy as np

    names = [n for n in DISPATCH_MIX if n in med]
    if len(names) < 3:
        return {}
    a = np.array([DISPATCH_MIX[n] for n in names], dtype=float)
    b = np.array([med[n] for n in names])
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    coef = np.clip(coef, 0.0, None)
    return {"eager_python_call_s": float(coef[0]), "eager_kernel_dispatch_s": float(coef[1]),
            "eager_view_dispatch_s": float(coef[2])}


def fit_overheads(records: list[dict]) -> dict[str, float]:
    """Overhead samples -> launch/graphs dispatch (graph replay per kernel), eager dispatch (wall per tiny op),
    module overhead (nn.Linear call minus F.linear call, floored at 0) and the eager dispatch split
    (fit_dispatch); medians of the samples."""
    med = {r["name"]: statistics.median(r["samples_s"]) for r in records if r["bench"] == "overhead"}
    graph = med["graph_kernel_s"]
    fitted = {"launch_overhead_s": graph, "graphs_dispatch_s": graph, "eager_dispatch_s": med["eager_op_s"],
              "module_overhead_s": max(0.0, med["module_call_s"] - med["functional_call_s"]), **fit_dispatch(med)}
    if "eager_kernel_dispatch_s" in fitted:
        from .framework_overhead import fit_framework_scale
        scale = fit_framework_scale(records, fitted["eager_kernel_dispatch_s"], fitted["eager_view_dispatch_s"],
                                    fitted["module_overhead_s"])
        if scale is not None:
            fitted["eager_framework_scale"] = scale
    return fitted


def fit_power(records: list[dict], power_limit_w: float) -> dict[str, float]:
    """Average power under each load -> idle watts and compute/memory fractions of the enforced power limit."""
    avg = {r["load"]: r["avg_power_w"] for r in records if r["bench"] == "power"}
    fitted = {"idle_power_w": avg["idle"], "power_compute_fraction": avg["compute"] / power_limit_w,
              "power_memory_fraction": avg["memory"] / power_limit_w}
    if "active" in avg:
        fitted["active_power_w"] = avg["active"]
    for kind in ("compute", "memory"):
        points = sorted((r["activity"], r["avg_power_w"] / power_limit_w) for r in records
                        if r["bench"] == "power_curve" and r["kind"] == kind
                        and (kind == "compute" or r.get("size", 0) >= MEMORY_CURVE_MIN_BYTES))
        if points:
            floor = avg.get("active", avg["idle"]) / power_limit_w
            xs, ys = [0.0], [floor]
            for x, y in points:
                if x > xs[-1] + 1e-4:
                    xs.append(x)
                    ys.append(max(y, ys[-1]))   # power does not fall as the load's activity rises
            fitted[f"power_{kind}_curve"] = Curve(x=xs, efficiency=ys)
    return fitted


def fit_calibration(raw: dict, defaults: CalibrationSpec | None = None) -> CalibrationSpec:
    """Raw measurements (the ``.raw.json`` content) -> CalibrationSpec. Pure: no GPU, no files.

    A section with no measurements (power without pynvml, say) takes ``defaults``' values and says so in notes.
    """
    from .collectives import fit_collectives

    recs, peaks, notes = raw["records"], raw["peaks"], []
    gemm_curves, tables, n = fit_gemm(recs, peaks, raw["grid"]["gemm"])
    attn, n2 = fit_attention(recs, peaks)
    memory, _, n3 = fit_memory(recs, peaks["memory_bw_bytes_per_s"])
    notes += n + n2 + n3
    fields = {}
    for name, fit, args in (("overheads", fit_overheads, (recs,)),
                            ("power", fit_power, (recs, float(raw["provenance"].get("power_limit_w", "nan"))))):
        try:
            fields.update(fit(*args))
        except (KeyError, ValueError, ZeroDivisionError):
            if defaults is None:
                raise AisimError(f"raw measurements have no usable {name} records and no defaults were given")
            keys = {"overheads": ("launch_overhead_s", "graphs_dispatch_s", "eager_dispatch_s", "module_overhead_s"),
                    "power": ("idle_power_w", "power_compute_fraction", "power_memory_fraction")}[name]
            fields.update({k: getattr(defaults, k) for k in keys})
            notes.append(f"{name}: not measured; values are the default rules' (default.yaml)")
            continue
        if name == "power":
            notes.append(f"power: NVML averages ({raw['provenance'].get('energy_method', '?')}); idle = nothing "
                         "running but this process's CUDA context open; compute = 8192^3 bf16 GEMM loop, memory = "
                         f"1 GiB copy loop, each over the enforced power limit {args[1]:.0f} W")
    coll, n4 = fit_collectives(recs)
    notes += n4
    notes.append(_conventions_note(peaks))
    return CalibrationSpec(device=raw["device"], measured=True, provenance=raw["provenance"],
                           gemm_efficiency=gemm_curves, gemm_tables=tables, attention_efficiency=attn,
                           memory_efficiency=memory, **{k: _sig(v) if isinstance(v, (int, float)) else v
                                                        for k, v in {**fields, **coll}.items()},
                           notes="\n".join(notes))


def _conventions_note(peaks: dict) -> str:
    return ("conventions: efficiency = max(flops/peak[dtype], bytes/bw)/t_measured against the datasheet peaks "
            f"{ {d: f'{v:.4g}' for d, v in peaks['flops_per_s'].items()} } FLOP/s and "
            f"{peaks['memory_bw_bytes_per_s']:.4g} B/s; bytes = inputs read once + outputs written once; "
            "attention forward FLOPs 4*B*H*Sq*Skv*D (causal: attended pairs only, Sq*(Sq+1)/2 for Sq == Skv); "
            f"attention backward FLOPs = {ATTN_BACKWARD_FLOPS_FACTOR}x forward (flash-attention convention), "
            "backward bytes = q, k, v, out, dout read + dq, dk, dv written; decode curves (q_len 1) are vs "
            "log10(bytes), prefill and GEMM curves vs log10(FLOPs), memory vs log10(bytes moved); curves are "
            f"medians in {CURVE_BIN_DECADES}-decade bins; memory ops count {MEMORY_OPS} input-sized tensors moved.")


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


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


def _product(*iterables):
    import itertools
    return itertools.product(*iterables)


# ---------------------------------------------------------------- GPU microbenchmarks

_TORCH_DTYPE = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


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
        dt = getattr(torch, _TORCH_DTYPE[it["dtype"]])

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
        dt, bw = getattr(torch, _TORCH_DTYPE[it["dtype"]]), it["direction"] == "backward"
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
    rms_norm (F.rms_norm) and softmax over the last dim."""
    import torch

    out = []
    for it in plan:
        dt = getattr(torch, _TORCH_DTYPE[it["dtype"]])
        moved = MEMORY_OPS[it["op"]] * it["size_bytes"]
        sets = rotation_sets(moved, l2_bytes)
        guess = predicted_time_s(0.0, moved, 1.0, peaks["memory_bw_bytes_per_s"])

        def build(it=it, dt=dt, sets=sets):
            return [_memory_call(torch, it, dt) for _ in range(sets)]

        label = f"memory {it['op']:10s} {it['dtype']} {it['size_bytes'] / 2**20:10.3f} MiB"
        out.append(_measure({**it, "rotation_sets": sets}, build, budget, "memory", guess * 120 + 0.01, label))
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
# Copies smaller than this stay in L2 (H100 50 MB, H200 60 MB): their traffic is not HBM activity and draws far
# less power (an 8 MiB copy at 75% of HBM bandwidth drew 259 W on H100, a 64 MiB one 450 W), so the memory curve,
# whose x is HBM activity, ignores them.
MEMORY_CURVE_MIN_BYTES = 64 * 2**20


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


# ---------------------------------------------------------------- orchestration

METHOD = ("CUDA-event timing (1 untimed call, 3 warm-up, then 5..100 reps, median; sleep kernel queued ahead of "
          "short ops), random-normal inputs rotated among sets of ~3x L2 where one set fits in L2; GEMM "
          "torch.matmul(x, W.t()) over M x N x K log grids in fp32 (TF32 off), tf32, fp16, bf16; SDPA forward "
          "and backward (prefill, causal and not) and decode (q_len 1), head_dim 128/64, 32 heads; memory-bound "
          "clone/add/gelu/silu/layer_norm/rms_norm/softmax at 4 KiB..2 GiB in fp16/fp32; overheads from a "
          "1000-kernel CUDA-graph replay, 2000 eager ops and 2000 nn.Linear vs F.linear calls; power by NVML "
          "while idle, while looping 8192^3 bf16 GEMMs and 1 GiB copies; all-reduce/all-gather by NCCL, one "
          "process per GPU, alpha-beta fit")


def run_calibration(device_name: str, out_path: Path, *, quick: bool = False, max_minutes: float = 4.0) -> Path:
    """Measure the local GPU (CUDA device 0, and all visible GPUs for collectives) and write ``out_path``
    (CalibrationSpec YAML) and ``<stem>.raw.json`` next to it. Returns ``out_path``.

    Raises AisimError when no CUDA GPU is visible or ``device_name`` is not a known GPU spec.
    """
    torch = _require_cuda()
    key, hw = resolve_device(device_name)
    out_path = Path(out_path)
    budget = Budget(total_s=max_minutes * 60.0, start=time.monotonic())
    peaks = {"flops_per_s": {d: hw.peak_for(d) for d in GEMM_DTYPES}, "memory_bw_bytes_per_s": hw.memory_bw_bytes_per_s,
             "source": f"hardware_specs/gpus/{key}.yaml (datasheet)"}
    props = torch.cuda.get_device_properties(0)
    from ..specs import all_hardware

    mismatch = gpu_name_mismatch(props.name, key, all_hardware())
    if mismatch:
        raise AisimError(mismatch)
    if props.name.strip().lower() not in {a.lower() for a in (hw.name, hw.display_name, *hw.aliases)}:
        print(f"warning: no GPU spec lists the local GPU name {props.name!r}; calibrating it as {key!r}", flush=True)
    l2_bytes = float(getattr(props, "L2_cache_size", 0) or hw.l2_bytes)
    _log(budget, f"calibrating {props.name} as {key!r} ({'quick' if quick else 'full'}, budget {max_minutes} min)")
    torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")    # context, cuBLAS handle
    torch.cuda.synchronize()
    meter, records = open_power_meter(), []
    power_s = 1.0 if quick else 2.0
    if meter is not None:
        time.sleep(0.5)
        records.append(bench_power(meter, "idle", power_s))
    records += bench_overheads()
    from .framework_overhead import bench_framework_overhead
    records += bench_framework_overhead()
    _log(budget, "overheads done")
    todo, skipped = gemm_plan(quick, peaks, l2_bytes)
    records += skipped + bench_gemm(todo, budget)
    records += bench_attention(attention_plan(quick), budget, peaks, l2_bytes)
    records += bench_memory(memory_plan(quick), budget, peaks, l2_bytes)
    if meter is not None:
        records += [bench_power(meter, load, power_s) for load in ("compute", "memory", "active")]
        records += bench_power_curve(meter, 1.0 if quick else 1.5, peaks)
    records += _collectives(torch, budget, quick)
    raw = {"device": key, "peaks": peaks, "records": records,
           "grid": {"gemm": dict(zip("mnk", GEMM_QUICK if quick else (GEMM_M, GEMM_NK, GEMM_NK)))},
           "provenance": _provenance(torch, props, meter, quick, budget)}
    return write_outputs(raw, out_path, budget)


def write_outputs(raw: dict, out_path: Path, budget: Budget | None = None) -> Path:
    """Write ``<stem>.raw.json`` and the fitted YAML; the YAML is checked by loading it back."""
    import yaml

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    raw_path = out_path.with_name(out_path.stem + ".raw.json")
    raw_path.write_text(json.dumps(raw, indent=1))
    spec = fit_calibration(raw, defaults=load_default_rules())
    out_path.write_text(f"# written by aisim.validation.calibrate; raw measurements in {raw_path.name}\n"
                        + yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, width=120))
    CalibrationSpec(**yaml.safe_load(out_path.read_text()))
    if budget is not None:
        _log(budget, f"wrote {out_path} and {raw_path.name}")
    return out_path


def load_default_rules() -> CalibrationSpec:
    """hardware_specs/calibration/default.yaml: the documented rules for a device with no calibration file."""
    from importlib import resources

    import yaml

    text = (resources.files("aisim.hardware_specs") / "calibration" / "default.yaml").read_text()
    return CalibrationSpec(**yaml.safe_load(text))


def resolve_device(name: str):
    """(file stem, HardwareSpec) for an aisim GPU name or alias, else UnknownNameError with close matches."""
    from ..specs import all_hardware

    hardware = all_hardware()
    for key, spec in hardware.items():
        if name.strip().lower() in {a.lower() for a in (key, spec.name, *spec.aliases)}:
            return key, spec
    raise UnknownNameError("GPU", name, sorted(hardware), "Calibration needs the GPU's datasheet spec in "
                           "hardware_specs/gpus/<name>.yaml (add one for a new GPU).")


def gpu_name_mismatch(local_name: str, key: str, hardware: dict) -> str | None:
    """An error message when the local GPU (torch's name for it) is another known GPU than ``key``, else None.

    Each GPU spec lists torch's device name among its aliases; a local name no spec lists passes (a new
    board name of a known GPU, say), with a printed warning by the caller.
    """
    def names(spec) -> set[str]:
        return {a.lower() for a in (spec.name, spec.display_name, *spec.aliases)}

    local = local_name.strip().lower()
    if local in names(hardware[key]):
        return None
    others = [k for k, spec in hardware.items() if local in names(spec)]
    if others:
        return (f"the local GPU is {local_name!r}, which aisim knows as {others[0]!r}, not {key!r}: "
                f"run with --device {others[0]} (a calibration file must describe the GPU it was measured on)")
    return None


def _require_cuda():
    try:
        import torch
    except ImportError as err:
        raise AisimError(f"`aisim calibrate` needs PyTorch with CUDA ({err}).") from None
    if not torch.cuda.is_available():
        raise AisimError(
            f"no CUDA GPU is visible (torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
            "`aisim calibrate` measures the local GPU: run it on the machine whose GPU you want to calibrate, "
            "with a CUDA build of PyTorch. To refit curves from an existing raw file without a GPU, use "
            "`python -m aisim.validation.calibrate --refit <file>.raw.json --out <file>.yaml`.")
    return torch


def _collectives(torch, budget: Budget, quick: bool) -> list[dict]:
    from .collectives import measure_collectives

    n = torch.cuda.device_count()
    if n < 2:
        _log(budget, "collectives: one GPU visible, not measured (allreduce fields stay empty)")
        return []
    seconds_left = budget.deadline("collectives") - time.monotonic()
    if seconds_left < 20:
        _log(budget, f"collectives: only {seconds_left:.0f} s of budget left, not measured")
        return []
    _log(budget, f"collectives: {n} GPUs, NCCL, one process per GPU")
    return measure_collectives(n, quick=quick, timeout_s=seconds_left)


def _provenance(torch, props, meter: PowerMeter | None, quick: bool, budget: Budget) -> dict[str, str]:
    import datetime
    import importlib.metadata
    import shlex
    import socket

    try:
        transformers = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers = "not installed"
    return {"gpu_name": props.name, "driver": meter.driver if meter else "unknown (pynvml unavailable)",
            "cuda": str(torch.version.cuda), "torch": torch.__version__, "transformers": transformers,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "power_limit_w": f"{meter.power_limit_w:.1f}" if meter else "unknown",
            "energy_method": meter.method if meter else "not measured",
            "command": shlex.join(sys.argv), "hostname": socket.gethostname(),
            "gpu_count": str(torch.cuda.device_count()), "mode": "quick" if quick else "full",
            "benchmark_wall_s": f"{budget.elapsed():.0f}", "method": METHOD}


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    """python -m aisim.validation.calibrate --device h100-sxm --out hardware_specs/calibration/h100-sxm.yaml"""
    p = argparse.ArgumentParser(prog="python -m aisim.validation.calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--device", help="aisim GPU name of the local GPU (a file stem in hardware_specs/gpus/)")
    p.add_argument("--out", type=Path, help="YAML to write (default hardware_specs/calibration/<device>.yaml)")
    p.add_argument("--quick", action="store_true", help="small grids (about 20 s on an H100)")
    p.add_argument("--max-minutes", type=float, default=4.0, help="wall-clock budget; grids shrink to fit")
    p.add_argument("--refit", type=Path, help="refit an existing .raw.json (no GPU needed) instead of measuring")
    args = p.parse_args(argv)
    try:
        if args.refit:
            raw = json.loads(args.refit.read_text())
            out = args.out or args.refit.with_name(args.refit.name.removesuffix(".raw.json") + ".yaml")
            if out.with_name(out.stem + ".raw.json").resolve() != args.refit.resolve():
                raise AisimError(f"--out {out} would not sit next to {args.refit} (same stem, .raw.json)")
            path = write_outputs(raw, out)
        else:
            if not args.device:
                raise AisimError("--device is required (the aisim GPU name of the local GPU, e.g. h100-sxm)")
            path = run_calibration(args.device, args.out or Path("hardware_specs/calibration") / f"{args.device}.yaml",
                                   quick=args.quick, max_minutes=args.max_minutes)
    except AisimError as err:
        print(f"aisim calibrate: error: {err}", file=sys.stderr)
        return 2
    print(f"calibration written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
