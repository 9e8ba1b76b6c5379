"""Assembling an Estimate from step costs: tokens, the fit check, the notes every estimate carries."""
from __future__ import annotations

from ..errors import AisimError
from ..results import Estimate, MemoryBreakdown, OpCost
from ..scenario import Scenario, calibration_note
from ..step import StepCost
from ..units import MS_PER_S
from ..workload import Workload

TOP_OPS = 12


NOT_FIT_HINT = ("use more GPUs (--tp, --pp), a smaller --batch or --seq, --quant or --kv-dtype fp8, or a GPU with "
                "more memory")


def train_not_fit_hint(zero: int, recompute: str, micro_batch: int, fsdp: str = "none") -> str:
    """What a training step that does not fit can change (--quant and --kv-dtype are refused there), less what the
    plan already does: full sharding (ZeRO 3 or --fsdp full), full recompute, a micro-batch of 1."""
    shard = ("" if zero >= 3 and fsdp in ("none", "full") else ", --fsdp full" if fsdp != "none"
             else ", data parallel with --zero 3" if zero else ", data parallel with --zero 1-3")
    smaller = "a smaller --micro-batch or --seq" if micro_batch > 1 else "a smaller --seq"
    return (f"use more GPUs (--tp, --pp{shard}), {smaller}, " + ("--recompute full, " if recompute != "full" else "")
            + "or a GPU with more memory")


def reserve_text(mem: MemoryBreakdown) -> str:
    """What the process holds outside PyTorch's allocator, in words: '1.31 GB CUDA context + 1.65 GB NCCL buffers'."""
    context = mem.runtime_reserved_gb - mem.nccl_reserved_gb
    return f"{context:.2f} GB CUDA context" + (f" + {mem.nccl_reserved_gb:.2f} GB NCCL buffers"
                                                if mem.nccl_reserved_gb else "")


def chunked_prefill_budget(sc: Scenario, prompt_tokens: int) -> int | None:
    """The engine's max_num_batched_tokens where it chunks prefills and one step of ``prompt_tokens`` exceeds it
    (the estimate prices them in one forward, the engine would not); else None."""
    s = sc.runtime.serving
    if s is None or not s.enable_chunked_prefill or prompt_tokens <= s.max_num_batched_tokens:
        return None
    return s.max_num_batched_tokens


def chunked_prefill_hint(sc: Scenario, prompt_tokens: int) -> str:
    """Under an engine that chunks prefills: a sentence for a refusal saying this step prices the whole batch's
    prompts in one forward, where the engine would not ('' otherwise)."""
    budget = chunked_prefill_budget(sc, prompt_tokens)
    if budget is None:
        return ""
    return (f" (this step runs all {prompt_tokens:,} prompt tokens in one forward; {sc.runtime.name} chunks prefills "
            f"at max_num_batched_tokens, {budget:,} by default, so a server holds far fewer "
            "activations: `aisim serve` simulates that schedule)")


def not_fit_reason(mem: MemoryBreakdown, gpu_name: str, hint: str = NOT_FIT_HINT) -> str | None:
    if mem.total_gb <= mem.usable_gb:
        return None
    room = (f"{mem.usable_gb:.2f} GB usable of the {mem.capacity_gb:.2f} GB of {gpu_name} ({reserve_text(mem)})"
            if mem.runtime_reserved_gb else f"{mem.capacity_gb:.2f} GB capacity of {gpu_name}")
    terms = [(name, getattr(mem, f"{key}_gb")) for name, key in (
        ("weights", "weights"), ("activations", "activations"), ("KV cache", "kv_cache"), ("gradients", "gradients"),
        ("optimizer", "optimizer"), ("workspace", "workspace"))]
    parts = ", ".join(f"{name} {gb:.2f}" for name, gb in terms if gb >= 0.005)
    return f"does not fit: {mem.total_gb:.2f} GB needed per GPU ({parts}) > {room}; {hint}"


def _engine_batch(sc: Scenario, w: Workload, phases: tuple[str, ...]) -> tuple[dict, int] | None:
    """Under a serving engine's profile, for a workload of ``phases``: the engine's settings on this GPU and the
    sequences one replica runs; else None."""
    s = sc.runtime.serving
    if s is None or w.phase not in phases:
        return None
    from .serve.run import engine_defaults

    return engine_defaults(s, sc.device.gpu), -(-w.batch // sc.plan.dp)


def engine_memory_reason(sc: Scenario, w: Workload) -> str | None:
    """Under a serving engine's profile (its ``serving`` memory policy: vLLM's gpu_memory_utilization of the total,
    transformers CB's fraction of the free memory), a prefill, decode or generate batch whose KV cache the engine's
    pool cannot hold at once does not run as one batch: the reason with the numbers, else None. The pool is what
    ``aisim serve`` sizes (serve.run.kv_capacity); models with sliding-window layers are not checked here."""
    engine = _engine_batch(sc, w, ("prefill", "decode", "generate"))
    if engine is None or sc.config.get("is_encoder_decoder"):
        return None   # the serving pool is sized for decoder-only models (aisim serve refuses the others)
    from ..errors import DoesNotFit
    from .serve.run import kv_capacity

    values, per_replica = engine
    replica = sc.with_plan(sc.plan.model_copy(update={"dp": 1})) if sc.plan.dp > 1 else sc
    try:
        cap = kv_capacity(replica, values["block_size"], values["max_num_batched_tokens"],
                          values["gpu_memory_utilization"])
    except DoesNotFit as exc:
        return f"does not fit under {sc.runtime.name}'s memory policy: {exc.detail}; {exc.hint}"
    if cap.sliding_groups:
        return None
    context = w.seq + (w.gen_tokens - 1 if w.phase == "generate" else 0)
    block = values["block_size"]
    if per_replica * -(-context // block) <= cap.blocks:    # each sequence holds whole blocks
        return None
    smaller = [flag for flag, given in (("--kv-dtype fp8", sc.kv_dtype == "fp8"),
                                        ("--quant fp8", sc.quant != "none")) if not given]
    return (f"does not fit under {sc.runtime.name}'s memory policy: {per_replica} sequences x {context:,} tokens "
            f"(blocks of {block}) need {per_replica * -(-context // block) * block:,} tokens of KV cache per replica > "
            f"the {cap.blocks * block:,} its pool holds ({cap.how}); fewer sequences at once (aisim serve queues the "
            f"rest), {', '.join(smaller + ['more GPUs (--tp)'])}")


def max_num_seqs_note(sc: Scenario, w: Workload) -> str | None:
    """An engine runs at most max_num_seqs sequences per step: said where a decode or generate batch (per replica)
    is larger (the estimate is one step over the whole batch; aisim serve runs the engine's schedule)."""
    engine = _engine_batch(sc, w, ("decode", "generate"))
    if engine is None or engine[1] <= engine[0]["max_num_seqs"]:
        return None
    limit, per_replica = engine[0]["max_num_seqs"], engine[1]
    return (f"{sc.runtime.name} runs at most {limit} sequences per step (max_num_seqs on {sc.device.gpu.name}): "
            f"a batch of {per_replica} per replica would run as {-(-per_replica // limit)} groups taking turns; the "
            "estimate is one step over the whole batch (`aisim serve` runs the engine's schedule)")


def refuse_gpu_count(name: str, command: str, where: str, multi_node: bool = False) -> None:
    """A planner's --devices entry that names a GPU count (h100x8, a one-node system such as dgx-h100, or, unless
    ``multi_node``, a multi-node system): a one-line error saying the planner searches the count itself (``where``:
    the flag that sets it)."""
    from ..catalog import resolve_device, resolve_gpu
    from ..specs import user_spec_dir

    if name.strip().lower().endswith((".yaml", ".yml")):
        raise AisimError(f"--devices {name!r}: {command} searches GPUs by name; copy a GPU file into "
                         f"{user_spec_dir() / 'gpus'} (a multi-node system file into systems/ beside it; aisim reads "
                         "them there, `aisim list devices` shows them) and give its name")
    try:
        dev = resolve_device(name)
    except AisimError:
        dev = None
    networked = dev is not None and dev.system is not None and dev.system.network is not None
    if dev is not None and (not networked or not multi_node) and (dev.count > 1 or networked):
        gpu = dev.gpu.name
        what = f"a multi-node system of {gpu}" if networked else f"{dev.count} x {gpu}"
        raise AisimError(f"--devices {name!r} is {what}: {command} takes GPU names and searches the GPU count itself "
                         f"({where}); give --devices {gpu}")
    stem, _, count = name.strip().lower().rpartition("x")
    if not (count.isdigit() and stem):
        return
    try:
        gpu = resolve_gpu(stem).name
    except AisimError:
        return
    raise AisimError(f"--devices {name!r}: {command} takes GPU names and searches the GPU count itself ({where}); "
                     f"give --devices {gpu}")


def price_notes(gpus: dict, prices: dict[str, float]) -> list[str]:
    """Notes on what each searched GPU (name -> HardwareSpec) is priced at: the spec's default price per GPU-hour
    (its source in the spec), unless --price set one; and the --price entries no searched GPU uses."""
    out = []
    defaults = [f"{name} ${gpu.price_usd_per_gpu_hour:g}" for name, gpu in sorted(gpus.items())
                if name not in prices and gpu.price_usd_per_gpu_hour]
    if defaults:
        out.append("$ at the GPU specs' default on-demand prices per GPU-hour (" + ", ".join(defaults)
                   + "; sources in hardware_specs/gpus/*.yaml): --price GPU=USD sets your own")
    unused = sorted(set(prices) - set(gpus))
    if unused:
        out.append(f"--price for {', '.join(unused)}: not among the searched devices (--devices), so not used")
    return out


def step_tokens(w: Workload) -> int:
    """Tokens a workload produces or processes: new tokens for decode and generate, sequences for encode."""
    if w.phase == "decode":
        return w.batch * w.step_tokens
    if w.phase == "generate":
        return w.batch * w.gen_tokens
    if w.phase == "encode":
        return w.batch
    return w.batch * w.seq


def estimate_from(sc: Scenario, w: Workload, cost: StepCost, memory: MemoryBreakdown, notes: list[str] = (),
                  tokens: int | None = None, table: list[OpCost] | None = None, **extra) -> Estimate:
    """The Estimate of a workload whose total cost is ``cost`` (times, energy, work) and peak memory ``memory``.
    A configuration that does not fit gets no times (it would not run) and says why with the numbers."""
    reason = not_fit_reason(memory, sc.device.gpu.name) or engine_memory_reason(sc, w)
    if reason and reason.startswith("does not fit") and w.phase in ("prefill", "generate"):
        reason += chunked_prefill_hint(sc, w.batch * w.seq)
    ok = reason is None
    tokens = step_tokens(w) if tokens is None else tokens
    runtime_s = cost.runtime_s
    cal = calibration_note(sc)
    held = power_limit_note(sc, cost) if ok else None
    turns = max_num_seqs_note(sc, w)
    assumptions = list(sc.assumptions) + list(notes) + [n for n in (cal, held, turns) if n]
    rows = list(cost.table if table is None else table)
    return Estimate(
        model=sc.model, device=sc.device.name, workload=w, plan=sc.plan, runtime=sc.runtime.name,
        runtime_ms=runtime_s * MS_PER_S if ok else None, memory_gb=memory.total_gb, memory=memory,
        energy_j=cost.energy_j if ok else None, energy_j_per_token=cost.energy_j / tokens if ok and tokens else None,
        power_w=cost.energy_j / (runtime_s * sc.plan.gpus) if ok and runtime_s else None,
        throughput_tokens_per_s=tokens / runtime_s if ok and runtime_s else None, tokens=tokens, fits=ok,
        flops=cost.flops, bytes=cost.bytes, top_ops=rows, unknown_ops=list(cost.unknown),
        calibrated=sc.calibration_is_own, assumptions=assumptions, not_fit_reason=reason,
        **(_busy_ms(cost) if ok else {}), **({k: v for k, v in extra.items()} if ok else {}))


def power_limit_note(sc: Scenario, cost: StepCost) -> str | None:
    """A note where the step's average power is the power-limit rule's ceiling (cost.energy.limited_energy_j), so a
    round figure such as 691.2 W does not read as a hard-coded one."""
    mix = sc.calibration.power_limit_mix
    if mix is None or not cost.runtime_s or sc.power is not None:
        return None
    ceiling = mix.limit_fraction * sc.device.gpu.board_power_w
    if cost.energy_j / (cost.runtime_s * sc.plan.gpus) < 0.999 * ceiling:
        return None
    return (f"average power held at {ceiling:.1f} W, {mix.limit_fraction:g} of the {sc.device.gpu.board_power_w:.0f} W "
            "board limit: the step's GEMMs would draw more (power_limit_mix, validation/harness/power_mix.py)")


def _busy_ms(cost: StepCost) -> dict[str, float]:
    """The run's GPU and host busy times (per pipeline stage), where the cost carries them (a total built from
    phases of different kinds, e.g. transcribe's, carries none)."""
    if not (cost.gpu_busy_s or cost.cpu_busy_s):
        return {}
    return {"gpu_busy_ms": cost.gpu_busy_s * MS_PER_S, "host_busy_ms": cost.cpu_busy_s * MS_PER_S}


def phase_rows(phase: str, rows, runtime_s: float) -> list[OpCost]:
    """Op rows of one phase of a multi-phase workload, named by phase, with shares of the whole run."""
    return [r.model_copy(update={"name": f"{phase} {r.name}",
                                 "share": r.time_ms / (runtime_s * MS_PER_S) if runtime_s else 0.0}) for r in rows]


def merge_rows(rows: list[OpCost], runtime_s: float) -> list[OpCost]:
    """One row per op name (summing rows of the same name), shares of the whole run, slowest first."""
    merged: dict[str, OpCost] = {}
    for r in rows:
        m = merged.get(r.name)
        merged[r.name] = r if m is None else m.model_copy(update={
            "count": m.count + r.count, "flops": m.flops + r.flops, "bytes": m.bytes + r.bytes,
            "time_ms": m.time_ms + r.time_ms})
    return sorted((r.model_copy(update={"share": r.time_ms / (runtime_s * MS_PER_S) if runtime_s else 0.0})
                   for r in merged.values()), key=lambda r: -r.time_ms)
