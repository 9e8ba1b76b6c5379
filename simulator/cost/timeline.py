"""The op timeline of one step: a CPU queue that dispatches and a GPU queue that runs kernels.

Eager PyTorch: every aten op costs the CPU its dispatch (``cpu_costs``), every nn.Module call
``module_overhead_s``; a kernel starts when both the GPU is free and the CPU has issued it. A sync
(``Tensor.item()``) makes the CPU wait for the GPU. CUDA graphs: ``graphs_dispatch_s`` per kernel. 'none':
kernel time only, as a profiler's sum of kernel times reports it. The step ends when both queues are done.

Layer repeats (Graph.repeats) are applied to each op as a block of back-to-back calls; this keeps the totals
exact and the overlap approximate where CPU-bound and GPU-bound ops alternate within a layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import CalibrationSpec, RuntimeSpec


@dataclass
class Timeline:
    runtime_s: float
    gpu_busy_s: float
    cpu_busy_s: float


# workload phase -> the eager_phase_scale key its host cost takes
PHASE_SCALE_KEY = {"decode": "decode", "forward-backward": "train", "train": "train"}


def host_scale(cal: CalibrationSpec, phase: str = "forward", model_type: str | None = None) -> float:
    """What every eager host cost of a ``phase`` step of a ``model_type`` model is multiplied by: the calibrated
    eager_framework_scale, its eager_phase_scale, and the architecture's own eager_framework_arch_scale
    (arch_scale)."""
    key = PHASE_SCALE_KEY.get(phase, "")
    return cal.eager_framework_scale * cal.eager_phase_scale.get(key, 1.0) * arch_scale(cal, phase, model_type)


def arch_scale(cal: CalibrationSpec, phase: str = "forward", model_type: str | None = None) -> float:
    """The calibration's eager_framework_arch_scale of ``model_type`` for ``phase`` (its 'forward' where the phase
    is not listed; 1 where the architecture is not)."""
    arch = cal.eager_framework_arch_scale.get(model_type or "", {})
    return arch.get(PHASE_SCALE_KEY.get(phase, "") or "forward", arch.get("forward", 1.0))


def cpu_costs(ops, kinds: list[str], launches: np.ndarray, cal: CalibrationSpec,
              runtime: RuntimeSpec, phase: str = "forward", model_type: str | None = None) -> np.ndarray:
    """CPU seconds to issue each op once.

    Eager, with the calibrated split: py_calls * P (Python-level torch calls the op's Python code made) plus K
    for a kernel-launching aten op (its own measured cost where the calibration's eager_op_dispatch_s has it) or V
    for a view; M per nn.Module call; a collective its measured issue cost (an all-reduce at least its measured
    in-model cost, ``eager_collective_host_adds`` plain adds, or eager ops in a file without the add).
    With a per-op host table (``eager_op_host_ratio`` and ``eager_add_dispatch_s``): each op costs the plain add's
    host time times its ratio (the table's 'kernel' / 'view' entries for ops it does not list; harness/op_host.py).
    Without the split (older files): one ``eager_dispatch_s`` per aten op. All scaled by the calibrated
    ``eager_framework_scale`` (the HF Python between the ops, measured on tiny non-judged models), times the
    calibration's ``eager_phase_scale`` for the workload ``phase`` (decode, training) where it has one and its
    ``eager_framework_arch_scale`` for ``model_type`` (host_scale)."""
    if runtime.dispatch == "none":
        return np.zeros(len(kinds))
    if runtime.dispatch == "graphs":
        per_kernel = runtime.kernel_overhead_s if runtime.kernel_overhead_s is not None else cal.graphs_dispatch_s
        return launches * per_kernel
    split = None not in (cal.eager_python_call_s, cal.eager_kernel_dispatch_s, cal.eager_view_dispatch_s)
    table = cal.eager_op_host_ratio if cal.eager_add_dispatch_s is not None else {}
    # eager_op_dispatch_s is stored in units of the per-kernel cost K (a masked_fill_ timed beside each op): with the
    # table, in units of the add
    own_unit = cal.eager_add_dispatch_s / cal.eager_kernel_dispatch_s if table and cal.eager_kernel_dispatch_s else 1.0
    costs = np.empty(len(kinds))
    for i, (op, kind) in enumerate(zip(ops, kinds)):
        if kind == "module":
            costs[i] = cal.module_overhead_s
        elif kind == "comm" and cal.eager_collective_host_adds and op.name == "nccl.all_reduce":
            # measured in the model, issue included: it replaces a tight loop's issue cost where larger; in plain
            # adds, or per eager op where the file has no add (default.yaml: GPUs without a calibration)
            unit = cal.eager_add_dispatch_s or cal.eager_kernel_dispatch_s or cal.eager_dispatch_s
            costs[i] = max(cal.allreduce_cpu_s or 0.0, collective_host_adds(cal, op.attrs.get("group", 2)) * unit)
        elif kind == "comm" and cal.allreduce_cpu_s is not None:
            costs[i] = cal.allreduce_cpu_s
        elif op.attrs.get("engine"):  # graph.engine: py_calls eager torch calls, `launches` of them kernels
            calls = max(op.attrs.get("py_calls", 1), launches[i], 1)
            costs[i] = (cal.eager_dispatch_s * calls if not split else
                        cal.eager_kernel_dispatch_s * launches[i] + cal.eager_view_dispatch_s * (calls - launches[i]))
        elif table:
            own = cal.eager_op_dispatch_s.get(op.name) if launches[i] else None
            if own is not None:
                costs[i] = own * own_unit
            elif op.name in table:
                costs[i] = cal.eager_add_dispatch_s * table[op.name]
            else:
                costs[i] = cal.eager_add_dispatch_s * (table.get("kernel", 1.0) * max(launches[i], 1) if launches[i]
                                                       else table.get("view", 1.0))
        elif not split:
            costs[i] = cal.eager_dispatch_s
        else:
            per_op = cal.eager_kernel_dispatch_s if launches[i] else cal.eager_view_dispatch_s
            own = cal.eager_op_dispatch_s.get(op.name) if launches[i] else None
            costs[i] = op.attrs.get("py_calls", 0) * cal.eager_python_call_s + (
                own if own is not None else per_op * max(launches[i], 1))
    costs *= host_scale(cal, phase)
    arch = arch_scale(cal, phase, model_type)
    if arch != 1.0:   # not the collectives: their host cost was derived against the family-median scale
        costs[[k != "comm" for k in kinds]] *= arch       # (derive_collective_host)
    return costs


def collective_host_adds(cal: CalibrationSpec, group: int) -> float:
    """eager_collective_host_adds of a collective over ``group`` ranks: the largest listed size <= group, else the
    smallest listed."""
    sizes = sorted(cal.eager_collective_host_adds)
    below = [n for n in sizes if n <= group]
    return cal.eager_collective_host_adds[below[-1] if below else sizes[0]]


def step_host_s(cal: CalibrationSpec, runtime: RuntimeSpec, phase: str = "forward",
                model_type: str | None = None) -> float:
    """CPU seconds of HF's work once per model call outside the ops (``eager_step_host_adds`` plain adds, scaled as
    the per-op costs are); eager dispatch with the per-op host table only, else 0."""
    if (runtime.dispatch != "eager" or cal.eager_add_dispatch_s is None or not cal.eager_op_host_ratio
            or not cal.eager_step_host_adds):
        return 0.0
    key = PHASE_SCALE_KEY.get(phase, "")
    adds = cal.eager_step_host_adds.get("train" if key == "train" else "forward", 0.0)
    return adds * cal.eager_add_dispatch_s * host_scale(cal, phase, model_type)


def simulate(gpu_s: np.ndarray, cpu_s: np.ndarray, repeats: np.ndarray, syncs: np.ndarray,
             head_cpu_s: float = 0.0) -> Timeline:
    """Walk the ops in order, after ``head_cpu_s`` of host work before the first op (step_host_s). A run of
    consecutive ops with the same repeat count that holds a sync (an engine's per-layer host sync, e.g.
    bitsandbytes) is walked call by call, since each repetition waits for the GPU; other ops are walked as blocks
    of back-to-back calls."""
    g_l, c_l, r_l, s_l = gpu_s.tolist(), cpu_s.tolist(), repeats.tolist(), syncs.tolist()
    state = [head_cpu_s, 0.0]  # cpu, gpu
    i, n = 0, len(g_l)
    while i < n:
        j = i + 1
        while j < n and r_l[j] == r_l[i]:
            j += 1
        r = r_l[i]
        if r > 1 and any(s_l[i:j]):
            whole = int(r)
            for _ in range(whole):
                for k in range(i, j):
                    _step(state, g_l[k], c_l[k], 1.0, s_l[k])
            if r > whole:
                for k in range(i, j):
                    _step(state, g_l[k], c_l[k], r - whole, s_l[k])
        else:
            for k in range(i, j):
                _step(state, g_l[k], c_l[k], r, s_l[k])
        i = j
    cpu, gpu = state
    return Timeline(runtime_s=max(cpu, gpu), gpu_busy_s=float(np.dot(gpu_s, repeats)),
                    cpu_busy_s=float(np.dot(cpu_s, repeats)) + head_cpu_s)


def _step(state: list[float], g: float, c: float, r: float, sync: bool) -> None:
    cpu, gpu = state
    if r <= 0:
        return
    if sync:
        state[0] = max(cpu, gpu) + c * r
        return
    cpu += c * r
    if g >= c:   # GPU-bound block: the first call waits for its dispatch, the rest queue behind it
        gpu = max(gpu, cpu - c * (r - 1)) + g * r
    else:        # CPU-bound block: the GPU follows the CPU, finishing one kernel after the last dispatch
        gpu = max(gpu + g * r, cpu + g)
    state[0], state[1] = cpu, gpu
