"""The op timeline of one step: a CPU queue that dispatches and a GPU queue that runs kernels.

Eager PyTorch: every aten op costs the CPU its dispatch (``cpu_costs``), every nn.Module call
``module_overhead_s``; a kernel starts when both the GPU is free and the CPU has issued it. A sync
(``Tensor.item()``) makes the CPU wait for the GPU. CUDA graphs: ``graphs_dispatch_s`` per kernel. 'none':
kernel time only, as a profiler's sum of kernel times reports it. The step ends when both queues are done.

Layer repeats (Graph.repeats): the trace holds a few layers whose ops repeat ``r`` times in the full model. Each
phase's (forward, backward) run of repeated ops is walked in rounds, layer after layer as the model runs them, each
op taking r / R of its calls per round (R the run's largest repeat), so the GPU's backlog from one layer's GEMMs
covers the next layer's host-bound ops as it does on the machine; once a round leaves the CPU-GPU gap where the
round before left it, the rest repeats exactly and is added at once. The ops before and after the run (embedding,
head, loss) are walked once.
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


def layer_walk_repeats(ops, repeats) -> np.ndarray:
    """The repeats the walk takes: a forward op whose signature the trace holds both inside its layers (a module path
    with a layer index) and outside them (the final norm shares the layers' norm signature, every nn.Module call
    one signature) gets one call per instance outside and the rest shared by the instances inside, so the rounds
    hold every op of a layer and the embedding and head run once. Each signature's total is unchanged. Backward
    ops carry no module path and keep theirs."""
    out = np.array(repeats, dtype=float)
    forward = [i for i, op in enumerate(ops) if op.phase == "forward"]
    top = max((out[i] for i in forward), default=1.0)
    groups: dict[tuple, list[int]] = {}
    for i in forward:   # a signature with instances outside the layers averages below the layers' count
        if 1 < out[i] < top * (1 - 1e-9):
            groups.setdefault(ops[i].signature, []).append(i)
    for idx in groups.values():
        inside = [i for i in idx if _in_layer(ops[i].scope)]
        outside = len(idx) - len(inside)
        if not inside or not outside:
            continue
        per_inside = (float(out[idx].sum()) - outside) / len(inside)
        if per_inside >= 1.0:
            out[idx] = 1.0
            out[inside] = per_inside
    return out


def _in_layer(scope: str) -> bool:
    """A module path inside a layer stack: one of its parts is an index (model.layers.3.mlp, transformer.h.0)."""
    return any(part.isdigit() for part in scope.split("."))


def simulate(gpu_s: np.ndarray, cpu_s: np.ndarray, repeats: np.ndarray, syncs: np.ndarray,
             head_cpu_s: float = 0.0, phases: tuple[str, ...] | None = None,
             walk_repeats: np.ndarray | None = None) -> Timeline:
    """Walk the ops in order, after ``head_cpu_s`` of host work before the first op (step_host_s), each phase's
    repeated layers in rounds (module docstring; ``phases``: each op's phase, one phase where not given;
    ``walk_repeats``: the repeats to walk where they differ from the totals' (layer_walk_repeats))."""
    walk = repeats if walk_repeats is None else walk_repeats
    g_l, c_l, r_l, s_l = gpu_s.tolist(), cpu_s.tolist(), walk.tolist(), syncs.tolist()
    state = [head_cpu_s, 0.0]  # cpu, gpu
    n = len(g_l)
    for lo, hi in _phase_runs(phases, n):
        top = max(r_l[lo:hi], default=1.0)
        layer = [k for k in range(lo, hi) if r_l[k] >= top * (1 - 1e-9)] if top > 1 else []
        if not layer:
            for k in range(lo, hi):
                _step(state, g_l[k], c_l[k], r_l[k], s_l[k])
            continue
        first, last = layer[0], layer[-1] + 1
        for k in range(lo, first):
            _step(state, g_l[k], c_l[k], r_l[k], s_l[k])
        _rounds(state, g_l[first:last], c_l[first:last], [r / top for r in r_l[first:last]], s_l[first:last], top)
        for k in range(last, hi):
            _step(state, g_l[k], c_l[k], r_l[k], s_l[k])
    cpu, gpu = state
    return Timeline(runtime_s=max(cpu, gpu), gpu_busy_s=float(np.dot(gpu_s, repeats)),
                    cpu_busy_s=float(np.dot(cpu_s, repeats)) + head_cpu_s)


def _phase_runs(phases: tuple[str, ...] | None, n: int) -> list[tuple[int, int]]:
    """[lo, hi) index ranges of consecutive ops of one phase."""
    if not phases:
        return [(0, n)]
    runs, lo = [], 0
    for k in range(1, n + 1):
        if k == n or phases[k] != phases[lo]:
            runs.append((lo, k))
            lo = k
    return runs


def _rounds(state: list[float], g: list[float], c: list[float], share: list[float], s: list[bool],
            rounds: float) -> None:
    """``rounds`` passes over one traced block of layers, op k taking share[k] of its calls per pass. The walk depends
    only on the CPU-GPU gap, so a whole pass that leaves the gap where the pass before left it repeats exactly from
    there on; and a pass without a sync in which the GPU never waited for a dispatch and fell further behind is
    followed by passes that do the same (the GPU-bound steady state). Either way the rest is added at once."""
    whole = int(rounds)
    gpu_round = sum(gk * sk for gk, sk in zip(g, share))
    no_sync = not any(s)
    gap = None
    done = 0
    while done < whole:
        before = list(state)
        for k in range(len(g)):
            _step(state, g[k], c[k], share[k], s[k])
        done += 1
        new_gap = state[0] - state[1]
        gpu_bound = (no_sync and gap is not None and new_gap <= gap
                     and abs(state[1] - before[1] - gpu_round) <= 1e-12 + 1e-9 * gpu_round)
        if gap is not None and (abs(new_gap - gap) <= 1e-12 or gpu_bound):
            left = whole - done
            state[0] += left * (state[0] - before[0])
            state[1] += left * (state[1] - before[1])
            break
        gap = new_gap
    if rounds > whole:
        part = rounds - whole
        for k in range(len(g)):
            _step(state, g[k], c[k], share[k] * part, s[k])


def _step(state: list[float], g: float, c: float, r: float, sync: bool) -> None:
    cpu, gpu = state
    if r <= 0:
        return
    if sync:
        state[0] = max(cpu, gpu) + c * r
        return
    cpu += c * r
    if g >= c:   # GPU-bound block: the first call waits for its dispatch, the rest queue behind it
        gpu = max(gpu, cpu - c * max(r - 1, 0.0)) + g * r
    else:        # CPU-bound block: the GPU follows the CPU, finishing one kernel (or the block's share of one) after
        gpu = max(gpu + g * r, cpu + g * min(r, 1.0))        # the last dispatch
    state[0], state[1] = cpu, gpu
