"""The public API: ``aisim.estimate(model=..., device=...)`` -> results.Estimate. The CLI only renders it.

Flow: resolve names -> choose the parallel plan -> trace the per-GPU operator graph (cached) -> per-op cost from
the formula registry -> per-op time on the device (calibrated roofline) -> timeline, memory, energy -> Estimate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from . import catalog
from .cost.power import PowerMode
from .errors import AisimError
from .plan import choose_plan
from .results import Estimate, OpCost
from .specs import RuntimeSpec, all_runtimes, load_calibration
from .units import MS_PER_S
from .workload import ParallelPlan, Workload

TOP_OPS = 12
TRANSCRIBE_RUNTIME = "ggml-cuda"


@dataclass
class StepCost:
    """Per-op arrays and totals for one traced graph on one device."""
    runtime_s: float
    energy_j: float
    power_w: float
    flops: float
    bytes: float
    table: list[OpCost]
    unknown: list[str]


def estimate(model: str, device: str, workload: str = "forward", batch: int = 1, seq: int = 1024, gen: int = 128,
             dtype: str = "fp16", tp: int | None = None, pp: int = 1, dp: int = 1, tp_scope: str = "all",
             runtime: str | RuntimeSpec | None = None, with_loss: bool = False, optimizer: str = "adamw",
             quant: str = "none", top_ops: int | None = TOP_OPS, audio_s: float | None = None, beam: int = 5,
             transcript_tokens: int | None = None, windows: int | None = None, power_limit_w: float | None = None,
             gpu_clock_mhz: float | None = None, power_mode: str | None = None, step_tokens: int = 1,
             transcript_counts=None) -> Estimate:
    """Estimate runtime, peak memory per GPU, energy and throughput of one workload step.

    ``seq`` is the input length (forward, prefill, forward-backward, train) or the context length (decode);
    generate runs a prefill of ``seq`` tokens and ``gen`` new tokens (gen - 1 decode steps); transcribe runs a
    recording of ``audio_s`` seconds (or the decoder work in ``transcript_counts``, a speech.TranscriptCounts)
    through whisper.cpp's phases.
    """
    if workload != "transcribe" and (audio_s, transcript_tokens, windows, transcript_counts) != (None,) * 4:
        raise AisimError("--audio-s, --tokens and --windows apply to --workload transcribe only")
    name, config = catalog.resolve_model(model)
    dev = catalog.resolve_device(device)
    default_runtime = runtime is None
    if default_runtime:  # a transcription is estimated as whisper.cpp runs it; everything else as eager PyTorch
        runtime = TRANSCRIBE_RUNTIME if workload == "transcribe" else "eager"
    rt = runtime if isinstance(runtime, RuntimeSpec) else _runtime(runtime)
    cal = load_calibration(dev.gpu.name)
    if dev.interconnect.allreduce_cpu_s is not None:  # measured on this host's GPU count: it replaces the device's
        cal = cal.model_copy(update={"allreduce_cpu_s": dev.interconnect.allreduce_cpu_s})
    try:
        w = Workload(phase=workload, batch=batch, seq=seq, gen_tokens=gen, dtype=dtype, with_loss=with_loss,
                     optimizer=optimizer, quant=quant, attn_impl=rt.attn_impl, encode_cross_kv=rt.encode_cross_kv,
                     logits_all=rt.prefill_logits == "all" and workload in ("prefill", "generate"),
                     audio_s=audio_s, beam=beam, transcript_tokens=transcript_tokens, windows=windows,
                     step_tokens=step_tokens)
    except ValueError as exc:
        raise AisimError(_pydantic_message(exc)) from None
    plan, note = choose_plan(config, dev.count, dev.name, batch, tp, pp, dp, tp_scope)
    _check_workload(config, w, rt, dev)
    assumptions = _assumptions(dev, cal, w, plan, config, note)
    if default_runtime and workload == "transcribe":
        assumptions.append(f"--runtime not given: {TRANSCRIBE_RUNTIME} (whisper.cpp's CUDA backend); "
                           "ggml-vulkan and eager (HF transformers) are the others")
    power, power_note = resolve_power_mode(dev.gpu, cal, power_mode, power_limit_w, gpu_clock_mhz)
    assumptions += [power_note] if power_note else []
    backend = rt.backend_efficiency(dev.gpu, w.dtype)
    if backend is not None:
        assumptions.append(f"runtime {rt.name} on {dev.gpu.architecture} (tensor cores: "
                           f"{'yes' if dev.gpu.has_tensor_cores else 'no'}): large GEMMs at "
                           f"{backend.gemm_fraction_of_peak:.0%} of the {w.dtype} peak, memory-bound kernels at "
                           f"{backend.memory_fraction_of_bw:.0%} of bandwidth ({backend.source})")
    elif rt.efficiency and rt.name.startswith("ggml"):
        assumptions.append(f"runtime {rt.name} has no documented efficiency for {dev.gpu.name} "
                           f"({dev.gpu.architecture}, tensor cores: {'yes' if dev.gpu.has_tensor_cores else 'no'}): "
                           "its kernels are costed at the device calibration's efficiencies (PyTorch's kernels); only "
                           "its dispatch, attention, KV cache and beam settings apply")
    if w.phase == "generate":
        result = _generate(name, config, dev, cal, rt, w, plan, assumptions, power)
    elif w.phase == "transcribe":
        from .speech import transcribe

        result = transcribe(name, config, dev, cal, rt, w, plan, assumptions, power, transcript_counts)
    else:
        from .graph.extract import trace_workload

        result = _assemble(name, dev, cal, rt, w, plan, trace_workload(config, w, plan), assumptions, power=power)
    return result if top_ops is None else result.model_copy(update={"top_ops": result.top_ops[:top_ops]})


def _runtime(name: str) -> RuntimeSpec:
    runtimes = all_runtimes()
    if name not in runtimes:
        raise catalog.UnknownNameError("runtime", name, sorted(runtimes),
                                       f"Choose one of: {', '.join(sorted(runtimes))}.")
    return runtimes[name]


def _assumptions(dev, cal, w: Workload, plan: ParallelPlan, config: dict, note: str | None) -> list[str]:
    """What the estimate assumed, printed with it: links, the default plan, quantization, calibration."""
    out = list(dev.assumptions) + ([note] if note else [])
    if w.dtype in ("bf16", "tf32") and not getattr(dev.gpu.peak_flops_per_s, w.dtype):
        out.append(f"{dev.gpu.name} has no {w.dtype} units: its matmuls are costed at the "
                   f"{'fp16' if w.dtype == 'bf16' else 'fp32'} rate (PyTorch emulates or falls back; real runs may "
                   "be slower)")
    if w.quant == "bitsandbytes-int8":
        out.append("--quant bitsandbytes-int8: every linear layer runs LLM.int8's MatMul8bitLt (input quantization "
                   "with outlier split, 2 host syncs, col32 transform, int8 GEMM, dequantization, fp16 outlier "
                   "matmul; aisim.graph.engine); the LM head stays 16-bit")
    elif w.quant != "none":
        out.append(f"--quant {w.quant}: linear weights read at {w.quant} width (weight-only); the dequantization "
                   "inside the GEMM kernel is taken as free")
    if plan.tp > 1 and (config.get("num_local_experts") or config.get("num_experts")):
        out.append("MoE experts are replicated on every tensor-parallel rank (no expert parallelism yet)")
    if not cal.measured:
        source = ("the documented default rules (hardware_specs/calibration/default.yaml)" if cal.device == "default"
                  else f"documented rules for this GPU (hardware_specs/calibration/{cal.device}.yaml)")
        out.append(f"{dev.gpu.name} has no measured calibration: efficiencies and overheads are {source}, not "
                   "measurements; run `aisim calibrate` on that GPU to measure them")
    return out


def resolve_power_mode(gpu, cal, mode: str | None, limit_w: float | None,
                       clock_mhz: float | None) -> tuple[PowerMode | None, str | None]:
    """The power mode to apply: a named mode of the GPU's spec file, overridden by an explicit limit or clock."""
    from .cost.energy import waiting_power_w

    named = None
    if mode is not None:
        modes = gpu.power_modes
        if mode not in modes:
            raise catalog.UnknownNameError("power mode", mode, sorted(modes),
                                           f"{gpu.name} defines: {', '.join(sorted(modes)) or 'none'}; or give "
                                           "--power-limit W / --gpu-clock MHz")
        named = modes[mode]
    limit = limit_w if limit_w is not None else (named.power_limit_w if named else None)
    clock = clock_mhz if clock_mhz is not None else (named.gpu_clock_mhz if named else None)
    if limit is None and clock is None:
        return None, (f"power mode {mode}: full clocks and board power ({named.source})" if named else None)
    idle = waiting_power_w(gpu, cal)
    for value, flag in ((limit, "--power-limit"), (clock, "--gpu-clock")):
        if value is not None and not math.isfinite(value):
            raise AisimError(f"{flag} must be a finite number (got {value})")
    if limit is not None and limit <= idle:
        raise AisimError(f"power limit {limit:g} W is at or below {gpu.name}'s waiting power ({idle:g} W); give a "
                         f"higher --power-limit (board power {gpu.board_power_w:g} W)")
    if limit is not None and limit > gpu.board_power_w:
        raise AisimError(f"power limit {limit:g} W is above {gpu.name}'s board power ({gpu.board_power_w:g} W); "
                         f"give at most {gpu.board_power_w:g}")
    if clock is not None and not 0 < clock <= gpu.boost_clock_mhz:
        raise AisimError(f"--gpu-clock {clock:g} MHz: give a clock between 1 and {gpu.name}'s boost clock "
                         f"({gpu.boost_clock_mhz:g} MHz)")
    text = (f"power mode{' ' + mode if mode else ''}: " +
            (f"power limit {limit:g} W (board {gpu.board_power_w:g} W)" if limit is not None else "") +
            (", " if limit is not None and clock is not None else "") +
            (f"GPU clock capped at {clock:g} MHz (boost {gpu.boost_clock_mhz:g} MHz)" if clock is not None else "") +
            "; compute-bound kernels slow with the clock, memory-bound ones keep their time until their compute "
            "floor overtakes (aisim.cost.power)" + (f"; {named.source}" if named else ""))
    return PowerMode(limit, clock), text


def _check_workload(config: dict, w: Workload, rt: RuntimeSpec, dev) -> None:
    """Refuse workloads the model or engine cannot run, with what to give instead."""
    enc_dec = bool(config.get("is_encoder_decoder"))
    if w.phase == "encode" and not enc_dec:
        raise AisimError("--workload encode needs an encoder-decoder model (e.g. whisper-medium.en); this one is "
                         "decoder-only: use forward or prefill")
    if w.phase == "transcribe":
        if w.batch != 1:
            raise AisimError("--workload transcribe estimates one recording: leave --batch at 1")
        if rt.request_loop is not None:
            raise AisimError(f"runtime {rt.name} is a text-serving engine; transcribe with ggml-cuda, ggml-vulkan "
                             "or eager")
    if rt.vendors and dev.gpu.vendor not in rt.vendors:
        raise AisimError(f"runtime {rt.name} runs on {', '.join(rt.vendors)} GPUs; {dev.gpu.name} is "
                         f"{dev.gpu.vendor}: choose another --runtime (aisim list runtimes)")
    _check_positions(config, w)


def _check_positions(config: dict, w: Workload) -> None:
    """Refuse a sequence longer than the model's position table (learned positions would index past it)."""
    if config.get("is_encoder_decoder"):  # the decoder's table; encode takes a fixed 30 s window
        limit = config.get("max_target_positions")
        if limit and w.phase in ("decode", "prefill", "generate") and w.seq > limit:
            raise AisimError(f"seq {w.seq} exceeds the decoder's {limit} positions; give a shorter --seq")
        return
    limit = config.get("max_position_embeddings") or config.get("n_positions")
    length = w.seq + (w.gen_tokens if w.phase == "generate" else 0)
    if limit and w.phase != "encode" and length > limit:
        given = f"seq {w.seq}" + (f" + gen {w.gen_tokens}" if w.phase == "generate" else "")
        raise AisimError(f"{given} exceeds the model's {limit} positions; give a shorter --seq")


# Workload fields as the CLI names them, for error messages
FLAGS = {"phase": "--workload", "audio_s": "--audio-s", "transcript_tokens": "--tokens", "windows": "--windows",
         "beam": "--beam", "batch": "--batch", "seq": "--seq", "gen_tokens": "--gen", "step_tokens": "--step-tokens",
         "dtype": "--dtype", "quant": "--quant", "optimizer": "--optimizer"}


def _pydantic_message(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(f"{FLAGS.get('.'.join(str(p) for p in e['loc']), '.'.join(str(p) for p in e['loc']))}: "
                         f"{e['msg']}" for e in errors())
    return str(exc)


def step_cost(graph, dev, cal, rt, w: Workload, plan: ParallelPlan, power: PowerMode | None = None) -> StepCost:
    from .cost.efficiency import runtime_scales
    from .cost.energy import step_energy_j
    from .cost.ops_time import op_time
    from .cost.timeline import cpu_costs, simulate
    from .formulas import is_known, kv_append_in_place, op_cost, quantized
    from .graph.engine import expand

    ops, repeats_list = expand(graph.ops, graph.repeats, w, rt, graph.meta.get("vocab_size") or 0,
                               w.batch // plan.dp)
    costs = [quantized(op_cost(op), op, w.quant) for op in ops]
    if rt.kv_cache == "preallocated":
        costs = [kv_append_in_place(c, op) for c, op in zip(costs, ops)]
    compute_scale, memory_scale = runtime_scales(rt, dev.gpu, cal, w.dtype)
    times = [op_time(op, c, dev, cal, w.dtype, compute_scale, memory_scale, rt.matvec_max_tokens)
             for op, c in zip(ops, costs)]
    gpu_s = np.array([t.gpu_s for t in times])
    compute_s = np.array([t.compute_s for t in times])
    memory_s = np.array([t.memory_s for t in times])
    # an engine's slower kernels keep the SMs as busy as the calibrated ones they replace (emulated tensor ops,
    # less tuned shaders): power follows the activity before the engine's scale
    busy_c, busy_m = compute_s / min(compute_scale, 1.0), memory_s / min(memory_scale, 1.0)
    power_w = None
    if power is not None:
        from .cost.power import apply_power_mode

        gpu_s, power_w = apply_power_mode(dev.gpu, cal, power, gpu_s, busy_c, busy_m)
        times = [replace(t, gpu_s=g) for t, g in zip(times, gpu_s.tolist())]
    repeats = np.array(repeats_list, dtype=float)
    kinds = [c.kind for c in costs]
    launches = np.array([c.launches for c in costs], dtype=float)
    cpu_s = cpu_costs(ops, kinds, launches, cal, rt)
    syncs = np.array([k == "sync" for k in kinds])
    timeline = simulate(gpu_s, cpu_s, repeats, syncs)
    runtime_s = timeline.runtime_s + rt.per_step_overhead_s
    # the GPUs of one pipeline stage (tensor x data parallel) work together; stages are costed in _assemble
    energy, avg_w = step_energy_j(dev.gpu, cal, gpu_s, busy_c, busy_m, repeats, runtime_s, plan.tp * plan.dp,
                                  power_w)
    flops = float(np.dot([c.flops for c in costs], repeats))
    nbytes = float(np.dot([c.bytes for c in costs], repeats))
    unknown = sorted({op.name for op in ops if not is_known(op)})
    return StepCost(runtime_s, energy, avg_w, flops, nbytes, _top_ops(ops, costs, times, repeats, runtime_s),
                    unknown)


def _top_ops(ops, costs, times, repeats, runtime_s: float) -> list[OpCost]:
    groups: dict[str, list] = {}
    for op, c, t, r in zip(ops, costs, times, repeats):
        if c.kind in ("none", "module") and t.gpu_s == 0:
            continue
        g = groups.setdefault(op.name, [0.0, 0.0, 0.0, 0.0, {}])
        g[0] += r
        g[1] += c.flops * r
        g[2] += c.bytes * r
        g[3] += t.gpu_s * r
        g[4][t.bound] = g[4].get(t.bound, 0.0) + t.gpu_s * r
    rows = [OpCost(name=n, count=int(round(g[0])), flops=g[1], bytes=g[2], time_ms=g[3] * MS_PER_S,
                   bound=max(g[4], key=g[4].get) if g[4] else "none",
                   share=g[3] / runtime_s if runtime_s else 0.0) for n, g in groups.items()]
    return sorted(rows, key=lambda r: -r.time_ms)


def _tokens(w: Workload, plan: ParallelPlan) -> int:
    if w.phase == "decode":
        return w.batch * w.step_tokens
    if w.phase == "generate":
        return w.batch * w.gen_tokens
    if w.phase == "encode":
        return w.batch
    return w.batch * w.seq


def _assemble(name, dev, cal, rt, w: Workload, plan, graph, assumptions, extra: dict | None = None,
              power: PowerMode | None = None) -> Estimate:
    from .cost.memory import breakdown

    cost = step_cost(graph, dev, cal, rt, w, plan, power)
    mem = breakdown(graph, w, dev)
    runtime_s, energy_j = _pipeline(cost, plan, dev, cal)
    power_w = energy_j / (runtime_s * plan.gpus) if runtime_s else None
    return _result(name, dev, cal, rt, w, plan, mem, runtime_s, energy_j, power_w, cost.flops, cost.bytes,
                   cost.table, cost.unknown, assumptions, extra or {})


def _pipeline(cost: StepCost, plan: ParallelPlan, dev, cal) -> tuple[float, float]:
    """(runtime s, energy J) of a step whose pipeline stages run one after another (no micro-batching yet): each
    stage's GPUs work for one stage time and wait, at the waiting power, while the other pp - 1 stages run."""
    from .cost.energy import waiting_power_w

    waiting_j = waiting_power_w(dev.gpu, cal) * (plan.pp - 1) * cost.runtime_s * plan.gpus
    return cost.runtime_s * plan.pp, cost.energy_j * plan.pp + waiting_j


def _result(name, dev, cal, rt, w, plan, mem, runtime_s, energy_j, power_w, flops, nbytes, table, unknown,
            assumptions, extra) -> Estimate:
    fits = mem.total_gb <= mem.capacity_gb
    tokens = _tokens(w, plan)
    reason = None
    if not fits:
        reason = (f"does not fit: {mem.total_gb:.2f} GB needed per GPU (weights {mem.weights_gb:.2f}, activations "
                  f"{mem.activations_gb:.2f}, KV cache {mem.kv_cache_gb:.2f}, gradients {mem.gradients_gb:.2f}, "
                  f"optimizer {mem.optimizer_gb:.2f}, workspace {mem.workspace_gb:.2f}) > "
                  f"{mem.capacity_gb:.2f} GB capacity of {dev.gpu.name}")
    ok = fits
    return Estimate(
        model=name, device=dev.name, workload=w.model_dump(), plan=plan.model_dump(), runtime=rt.name,
        runtime_ms=runtime_s * MS_PER_S if ok else None, memory_gb=mem.total_gb, memory=mem,
        energy_j=energy_j if ok else None, energy_j_per_token=energy_j / tokens if ok else None,
        power_w=power_w if ok else None, throughput_tokens_per_s=tokens / runtime_s if ok and runtime_s else None,
        tokens=tokens, fits=fits, flops=flops, bytes=nbytes, top_ops=table, unknown_ops=unknown,
        calibrated=cal.measured, assumptions=assumptions, not_fit_reason=reason,
        ttft_ms=extra.get("ttft_ms") if ok else None, tpot_ms=extra.get("tpot_ms") if ok else None,
        phases={k: v for k, v in extra.get("phases", {}).items()} if ok else {})


def _generate(name, config, dev, cal, rt, w: Workload, plan, assumptions, power: PowerMode | None = None) -> Estimate:
    """Prefill of ``seq`` tokens, then gen - 1 decode steps; decode time is linear in context, so the mean step
    is the mean of the first (context seq + 1) and last (context seq + gen - 1) steps."""
    from .cost.memory import breakdown
    from .graph.extract import trace_workload

    steps = max(w.gen_tokens - 1, 0)
    prefill = w.model_copy(update={"phase": "prefill"})
    first = w.model_copy(update={"phase": "decode", "seq": w.seq + 1, "logits_all": False})
    last = first.model_copy(update={"seq": w.seq + max(steps, 1)})
    g_prefill = trace_workload(config, prefill, plan)
    g_first, g_last = trace_workload(config, first, plan), trace_workload(config, last, plan)
    c_prefill = step_cost(g_prefill, dev, cal, rt, prefill, plan, power)
    c_first = step_cost(g_first, dev, cal, rt, first, plan, power)
    c_last = step_cost(g_last, dev, cal, rt, last, plan, power)
    ttft_s, prefill_j = _pipeline(c_prefill, plan, dev, cal)
    (first_s, first_j), (last_s, last_j) = _pipeline(c_first, plan, dev, cal), _pipeline(c_last, plan, dev, cal)
    tpot_s = (first_s + last_s) / 2
    runtime_s = ttft_s + tpot_s * steps
    mem = breakdown(g_last, last, dev)
    mem_prefill = breakdown(g_prefill, prefill, dev)
    if mem_prefill.total_gb > mem.total_gb:
        mem = mem_prefill
    energy_j = prefill_j + (first_j + last_j) / 2 * steps
    table = sorted(_phase_rows("prefill", c_prefill.table, 1, runtime_s) +
                   _phase_rows("decode", c_last.table, steps, runtime_s), key=lambda r: -r.time_ms)
    extra = {"ttft_ms": ttft_s * MS_PER_S, "tpot_ms": tpot_s * MS_PER_S,
             "phases": {"prefill_ms": ttft_s * MS_PER_S, "decode_total_ms": tpot_s * steps * MS_PER_S}}
    return _result(name, dev, cal, rt, w, plan, mem, runtime_s, energy_j, energy_j / (runtime_s * plan.gpus),
                   c_prefill.flops + c_last.flops * steps, c_prefill.bytes + c_last.bytes * steps,
                   table, sorted(set(c_prefill.unknown) | set(c_last.unknown)), assumptions, extra)


def _phase_rows(phase: str, rows: list[OpCost], times: int, runtime_s: float) -> list[OpCost]:
    """Op rows of one phase of a generate workload, repeated ``times`` and shared over the whole run."""
    return [OpCost(name=f"{phase} {r.name}", count=round(r.count * times), flops=r.flops * times, bytes=r.bytes * times,
                   time_ms=r.time_ms * times, bound=r.bound,
                   share=r.time_ms * times / (runtime_s * MS_PER_S) if runtime_s else 0.0) for r in rows]
