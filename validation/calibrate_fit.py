"""Calibration fitting: raw microbenchmark records -> CalibrationSpec. Pure: no GPU, no files.

Conventions (FLOPs, bytes, efficiency = roofline time / measured time) are those of the cost model, so the
efficiencies plug into it unchanged; tests/test_calibrate.py checks them with hand-worked numbers.
"""
from __future__ import annotations

import math
import statistics

from ..errors import AisimError
from ..formulas import FLASH_BACKWARD_FLOPS_RATIO
from ..formulas import attention_flops as _formula_attention_flops
from ..graph.ops import TensorMeta
from ..specs import CalibrationSpec, Curve, GemmTable, default_calibration
from ..units import DTYPE_BYTES

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
# elementwise ops with an operand whose innermost dimension is not contiguous (a transpose of the last two dims:
# x.t().contiguous(), x.t() + y), the uncoalesced case; fitted into their own curve
TRANSPOSED_OPS = {"copy_t": 2, "add_t": 3}
MEMORY_SIZES = tuple(4096 * 4**i for i in range(10)) + (2 * 2**30,)     # input bytes, 4 KiB .. 2 GiB
SLEEP_CYCLES_PER_S = 2.0e9       # torch.cuda._sleep counts SM cycles; ~H100/H200 boost (1.98 GHz); slower = longer
CURVE_BIN_DECADES = 0.5          # curves: median efficiency in bins of half a decade of log10(size)
ELEM_BYTES = DTYPE_BYTES
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


def fit_transposed(records: list[dict], memory_bw_bytes_per_s: float) -> tuple[Curve | None, list[str]]:
    """Transposed-operand elementwise records -> their curve (None where not measured)."""
    rows = [r for r in records if r["bench"] == "memory_t" and r.get("time_s")]
    if not rows:
        return None, []
    moved = [TRANSPOSED_OPS[r["op"]] * r["size_bytes"] for r in rows]
    effs = [b / memory_bw_bytes_per_s / r["time_s"] for b, r in zip(moved, rows)]
    return (grouped_curve([r["size_bytes"] for r in rows], moved, effs),
            [f"transposed memory: {len(rows)} (op, dtype, size) points, ops {sorted({r['op'] for r in rows})}"])


def fit_fixed_plus_linear(times_s, sizes) -> tuple[float, float]:
    """(t0 seconds, seconds per unit of size) of t = t0 + size x c, least squares of the relative error (each record
    weighted by 1 / its time): the form of the memory-bound rules (default.yaml provenance.method)."""
    import numpy as np

    t, x = np.asarray(times_s, dtype=float), np.asarray(sizes, dtype=float)
    (t0, per_unit), *_ = np.linalg.lstsq(np.stack([1 / t, x / t], axis=1), np.ones_like(t), rcond=None)
    return float(t0), float(per_unit)


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


def fit_overheads(records: list[dict], defaults: CalibrationSpec | None = None) -> dict:
    """Overhead samples -> launch/graphs dispatch (graph replay per kernel), eager dispatch (wall per tiny op),
    module overhead (nn.Linear call minus F.linear call, floored at 0) and the eager dispatch split
    (fit_dispatch); medians of the samples. Where ``defaults`` carry the per-op host table
    (eager_op_host_ratio, portable ratios: validation/harness/op_host.py) and the records time a plain add
    (add_out_s), the fit uses it: eager_add_dispatch_s = that add, and eager_framework_scale is the tiny models'
    measured time over what the per-op costs predict."""
    med = {r["name"]: statistics.median(r["samples_s"]) for r in records if r["bench"] == "overhead"}
    graph = med["graph_kernel_s"]
    fitted = {"launch_overhead_s": graph, "graphs_dispatch_s": graph, "eager_dispatch_s": med["eager_op_s"],
              "module_overhead_s": max(0.0, med["module_call_s"] - med["functional_call_s"]), **fit_dispatch(med)}
    if "eager_kernel_dispatch_s" not in fitted:
        return fitted
    from .framework_overhead import fit_framework_scale, fit_framework_scale_per_op

    table = defaults.eager_op_host_ratio if defaults is not None else {}
    if table and "add_out_s" in med:
        fitted.update(eager_add_dispatch_s=med["add_out_s"], eager_op_host_ratio=dict(table),
                      eager_collective_host_adds=dict(defaults.eager_collective_host_adds))
        cal = defaults.model_copy(update={k: v for k, v in fitted.items() if k in CalibrationSpec.model_fields})
        scale = fit_framework_scale_per_op(records, cal)
    else:
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


STREAM_OPS = ("copy", "add")
STREAM_MIN_BYTES = 2 ** 30   # tensor size of the plateau records


def fit_stream_fraction(records: list[dict], memory_bw_bytes_per_s: float) -> float | None:
    """``stream_bandwidth_fraction``: the median fraction of datasheet bandwidth of the largest copy and add records
    (>= 1 GiB tensors; bytes moved = read + written, MEMORY_OPS); None without such records."""
    values = [r["size_bytes"] * MEMORY_OPS[r["op"]] / r["time_s"] / memory_bw_bytes_per_s for r in records
              if r.get("bench") == "memory" and r.get("op") in STREAM_OPS and r.get("time_s")
              and r.get("size_bytes", 0) >= STREAM_MIN_BYTES]
    return round(statistics.median(values), 3) if values else None


def fit_calibration(raw: dict, defaults: CalibrationSpec | None = None) -> CalibrationSpec:
    """Raw measurements (the ``.raw.json`` content) -> CalibrationSpec. Pure: no GPU, no files.

    A section with no measurements (power without pynvml, say) takes ``defaults``' values and says so in notes.
    """
    from .collectives import fit_collectives

    recs, peaks, notes = raw["records"], raw["peaks"], []
    gemm_curves, tables, n = fit_gemm(recs, peaks, raw["grid"]["gemm"])
    attn, n2 = fit_attention(recs, peaks)
    memory, _, n3 = fit_memory(recs, peaks["memory_bw_bytes_per_s"])
    transposed, n5 = fit_transposed(recs, peaks["memory_bw_bytes_per_s"])
    notes += n + n2 + n3 + n5
    fields = {}
    stream = fit_stream_fraction(recs, peaks["memory_bw_bytes_per_s"])
    if stream is not None:
        fields["stream_bandwidth_fraction"] = stream
    for name, fit, args in (("overheads", fit_overheads, (recs, defaults or default_calibration())),
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
    if "eager_phase_scale" not in fields:
        # a ratio of host costs that held across hosts (default.yaml provenance); the full calibration does not
        # time the tiny models' forward-backward (python -m aisim.validation.framework_overhead does)
        fields["eager_phase_scale"] = dict((defaults or default_calibration()).eager_phase_scale)
        notes.append(f"eager_phase_scale {fields['eager_phase_scale']}: the default rules' (not measured here)")
    notes.append(_conventions_note(peaks))
    return CalibrationSpec(device=raw["device"], measured=True, provenance=raw["provenance"],
                           gemm_efficiency=gemm_curves, gemm_tables=tables, attention_efficiency=attn,
                           memory_efficiency=memory, transposed_memory_efficiency=transposed,
                           **{k: _sig(v) if isinstance(v, (int, float)) else v
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


# Copies smaller than this stay in L2 (H100 50 MB, H200 60 MB): their traffic is not HBM activity and draws far
# less power (an 8 MiB copy at 75% of HBM bandwidth drew 259 W on H100, a 64 MiB one 450 W), so the memory curve,
# whose x is HBM activity, ignores them.
MEMORY_CURVE_MIN_BYTES = 64 * 2**20
