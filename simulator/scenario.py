"""Resolve once: names, paths or objects -> one validated Scenario that every study costs steps against.

A Scenario is what runs (model config, device or system, calibration, runtime, power mode, parallel plan,
precision) plus the assumptions that resolving it made. It is built once per request; studies never re-resolve
names and never call the public API. ``Scenario.key`` identifies it for the step-cost caches.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import catalog
from .cost.power import PowerMode
from .errors import AisimError
from .plan import check_ep, check_ep_experts, choose_plan
from .specs import (CalibrationSpec, Device, HostSpec, RuntimeSpec, all_runtimes, calibration_file, calibration_for,
                    load_yaml, parse_spec)
from .workload import DType, ParallelPlan, Quant, StepShape, TpScope, Workload

TRANSCRIBE_RUNTIME = "ggml-cuda"
CalibrationChoice = Union[Literal["auto", "none"], Path, CalibrationSpec]


class ScenarioRequest(BaseModel):
    """What a user gives to resolve a scenario (strict: a wrong type is an error, never a silent coercion)."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True,
                              allow_inf_nan=False)
    model: Union[str, Path] = Field(description="shipped name (opt-6.7b, llama-3-70b), HF repo id, or config.json "
                                    "path")
    device: Union[str, Path, Device] = Field(description="GPU name, NAMExN, system name, or a GPU/system YAML path")
    dtype: Union[DType, Literal["auto"]] = Field("fp16", description="compute dtype; auto: as the engine picks it "
                                                   "from config.json (auto_dtype)")
    quant: Quant = "none"
    tp: int | None = Field(None, ge=1, le=100_000)
    pp: int = Field(1, ge=1, le=100_000)
    dp: int | None = Field(None, ge=1, le=100_000)
    tp_scope: TpScope = "all"
    ep: int = Field(1, ge=1, le=100_000, description="MoE expert parallel degree (experts spread over ep GPUs)")
    kv_dtype: Literal["auto", "fp16", "bf16", "fp8"] = Field("auto", description="KV cache element type (auto: "
                                                              "the model dtype)")
    runtime: Union[str, RuntimeSpec, None] = None
    calibration: Union[str, Path, CalibrationSpec] = "auto"
    host: Union[str, Path, HostSpec, None] = Field(None, description="host file (aisim calibrate --host-only): "
                                                   "this machine's eager dispatch costs replace the calibration's")
    power_mode: str | None = None
    power_limit_w: float | None = Field(None, gt=0)
    gpu_clock_mhz: float | None = Field(None, gt=0)
    with_loss: bool = False
    optimizer: Literal["adamw", "sgd"] = "adamw"


class Scenario(BaseModel):
    """A resolved, validated scenario. Build it with ``resolve_scenario``."""
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    model: str
    config: dict
    device: Device
    calibration: CalibrationSpec
    runtime: RuntimeSpec
    power: PowerMode | None = None
    plan: ParallelPlan
    dtype: DType
    quant: Quant
    kv_dtype: Literal["auto", "fp16", "bf16", "fp8"] = "auto"
    with_loss: bool = False
    optimizer: Literal["adamw", "sgd"] = "adamw"
    assumptions: tuple[str, ...] = ()
    default_rules_asked: bool = Field(False, description="--calibration none: the default rules were asked for")
    key: str = Field(description="hash of everything that changes a step's cost (cache key)")

    @property
    def calibration_is_own(self) -> bool:
        """A measured calibration of this GPU: its file says ``measured`` and names this GPU (not the default rules,
        not another GPU's file given with --calibration)."""
        return self.calibration.measured and self.calibration.device == self.device.gpu.name

    def workload(self, shape: StepShape, **overrides) -> Workload:
        """The traced workload of one step of this scenario (precision and runtime-set tracing options added;
        ``overrides`` replace fields, e.g. a study's own tracing option)."""
        logits_all = shape.logits_all
        if logits_all is None:
            logits_all = self.runtime.prefill_logits == "all" and shape.phase == "prefill"
        return Workload(phase=shape.phase, batch=shape.batch, seq=shape.seq, step_tokens=shape.step_tokens,
                        logits_all=logits_all, static_cache_len=shape.static_cache_len, dtype=self.dtype,
                        quant=self.quant, with_loss=self.with_loss, optimizer=self.optimizer,
                        attn_impl=self.runtime.attn_impl,
                        encode_cross_kv=self.runtime.encode_cross_kv and shape.phase == "encode"
                        ).model_copy(update=overrides)

    def with_plan(self, plan: ParallelPlan) -> "Scenario":
        return self.model_copy(update={"plan": plan, "key": _key(self.config, self.device, self.calibration,
                                                                 self.runtime, self.power, plan, self.dtype,
                                                                 self.quant, self.with_loss, self.optimizer,
                                                                 self.kv_dtype)})


def resolve_scenario(request: ScenarioRequest, phase: str = "forward", batch: int | None = None,
                     shard_states: str | None = None) -> Scenario:
    """Resolve every name once and check that the pieces go together. ``phase`` picks the default runtime
    (whisper.cpp's for transcribe) and ``batch`` checks the default plan's data parallel degree; ``shard_states``
    (a training plan's sharding, e.g. "ZeRO stage 3") makes the default plan data parallel (plan.choose_plan)."""
    name, config = catalog.resolve_model(request.model)
    dequantized_note = None
    if phase in TRAIN_PHASES:
        # a quantized checkpoint (DeepSeek-V3's fp8, gpt-oss's MXFP4 experts) trains in the precision's dtype
        dequantized_note = quantized_training_note(config)
        config = {k: v for k, v in config.items() if k != "quantization_config"}
    dev = catalog.resolve_device(request.device)
    rt, default_note = _runtime(request.runtime, phase)
    cal, cal_note = _calibration(request.calibration, dev)
    cal, host_note = _host(request.host, cal)
    if dev.interconnect.allreduce_cpu_s is not None:  # measured on this host's GPU count: it replaces the device's
        cal = cal.model_copy(update={"allreduce_cpu_s": dev.interconnect.allreduce_cpu_s})
    # serving engines with a vocab-parallel head, and training as Megatron runs it (VocabParallelEmbedding, the
    # output layer and vocab-parallel cross entropy: graph.sharding): 'all' shards the vocabulary too
    vocab_parallel = rt.vocab_parallel_head or phase in TRAIN_PHASES
    tp_scope = "full" if vocab_parallel and request.tp_scope == "all" else request.tp_scope
    check_ep_experts(config, request.ep)
    host = catalog.node_gpus(dev)
    plan, plan_notes = choose_plan(config, dev.count, dev.name, batch, request.tp, request.pp, request.dp, tp_scope,
                                  rt.replicate_kv_heads, shard_states, gpu_name=dev.gpu.name,
                                  node_gpus=host, cross_node=catalog.spans_nodes(dev),
                                  pipeline_fallback=phase not in TRAIN_PHASES, ep=request.ep)
    if dev.system is None and dev.gpu.nvlink_kind == "switch" and plan.tp > host:
        raise AisimError(f"tensor parallel {plan.tp} on {dev.name}: one host joins at most {host} {dev.gpu.name} "
                         "GPUs and no multi-node system file of them prices the network between hosts; keep --tp "
                         f"<= {host} (--pp or data parallel across hosts) or add one (gpus_per_node, network) under "
                         "hardware_specs/systems/")
    from .graph.engine import moe_routing

    plan = plan.model_copy(update={"ep": check_ep(config, plan, request.ep),
                                   "moe_reduce_once": "fused_moe" in rt.fusions and plan.tp > 1
                                   and moe_routing(config) is not None})
    if rt.vendors and dev.gpu.vendor not in rt.vendors:
        raise AisimError(f"runtime {rt.name} runs on {', '.join(rt.vendors)} GPUs; {dev.gpu.name} is "
                         f"{dev.gpu.vendor}: choose another --runtime (aisim list runtimes)")
    dtype, dtype_note = auto_dtype(config, rt, dev.gpu) if request.dtype == "auto" else (request.dtype, None)
    # a training step runs in its --precision: a quantized checkpoint is not re-read quantized there
    quant, quant_note = checkpoint_quant(config, request.quant) if phase not in TRAIN_PHASES else (request.quant, None)
    _check_capability(rt, dev.gpu, dtype, quant, config if phase not in TRAIN_PHASES else {})
    power, power_note = resolve_power_mode(dev.gpu, cal, request.power_mode, request.power_limit_w,
                                           request.gpu_clock_mhz)
    plan_notes = [*plan_notes, uneven_stages_note(config, plan.pp, phase, rt.name), dequantized_note]
    if phase in TRAIN_PHASES and plan.tp > 1 and plan.tp_scope == "full":
        plan_notes.append(f"training tensor parallel {plan.tp}: the embedding and LM head vocab-parallel and the loss on "
                          "each rank's slice of the logits (Megatron's VocabParallelEmbedding, output layer and "
                          "vocab-parallel cross entropy); no sequence parallelism: the norms, residual adds and "
                          "other elementwise ops run over the whole sequence on every rank, in HF's unfused kernels "
                          "(Megatron's --sequence-parallel splits them tp ways and its fused kernels are fewer): "
                          "read tensor-parallel training steps as an upper bound")
    notes = list(dev.assumptions) + [n for n in (catalog.defaults_note(config), *plan_notes, default_note, cal_note,
                                                 host_note, power_note, dtype_note, quant_note) if n]
    notes += _precision_notes(dev, dtype, quant, plan, config, rt, phase)
    notes += _runtime_notes(rt, dev, dtype)
    if request.kv_dtype == "fp8" and rt.name == "transformers-cb":
        raise AisimError("--kv-dtype fp8 with --runtime transformers-cb: transformers' continuous batching keeps its "
                         "paged cache in the model dtype (generation/continuous_batching/cache.py 166, 251-252); "
                         "use --runtime vllm for an fp8 KV cache, or leave --kv-dtype auto")
    if request.kv_dtype == "fp8" and rt.static_cache:
        raise AisimError(f"--kv-dtype fp8 with --runtime {rt.name}: HF's StaticCache allocates K and V in the model "
                         "dtype (transformers cache_utils.py StaticLayer.lazy_initialization); use --runtime vllm for "
                         "an fp8 KV cache, or leave --kv-dtype auto")
    if request.kv_dtype == "fp8" and rt.kv_cache != "preallocated":
        notes.append(f"--kv-dtype fp8 under --runtime {rt.name}: HF's DynamicCache keeps K and V in the model dtype "
                     "(transformers' quantized caches are int2/int4); the cache memory and the attention reads are "
                     "priced at 1 byte per element as a serving engine stores them, the cache concatenation at the "
                     "model dtype. --runtime vllm models an fp8 cache end to end")
    return Scenario(model=name, config=config, device=dev, calibration=cal, runtime=rt, power=power, plan=plan,
                    dtype=dtype, quant=quant, kv_dtype=request.kv_dtype, with_loss=request.with_loss,
                    optimizer=request.optimizer, assumptions=tuple(notes),
                    default_rules_asked=isinstance(request.calibration, str) and request.calibration == "none",
                    key=_key(config, dev, cal, rt, power, plan, dtype, quant, request.with_loss,
                             request.optimizer, request.kv_dtype))


def scenario(model, device, **options) -> Scenario:
    """``resolve_scenario`` from keyword arguments, with pydantic's errors as one AisimError line."""
    phase = options.pop("phase", "forward")
    batch = options.pop("batch", None)
    return resolve_scenario(build_request(ScenarioRequest, model=model, device=device, **options), phase, batch)


def build_request(cls: type[BaseModel], **fields):
    """``cls(**fields)`` with validation errors as one line naming the CLI flags."""
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise AisimError(validation_message(exc)) from None


# CLI flags by field name, for error messages
FLAGS = {"phase": "--workload", "audio_s": "--audio-s", "transcript_tokens": "--tokens", "windows": "--windows",
         "gen_tokens": "--gen", "gen": "--gen", "step_tokens": "--step-tokens", "power_limit_w": "--power-limit",
         "gpu_clock_mhz": "--gpu-clock", "tp_scope": "--tp-scope", "top_ops": "top_ops"}


def _flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def _literal_path(e: dict) -> str:
    """A literal error's field, without the branch a Union adds to its location (``dtype.literal['auto']``)."""
    return ".".join(str(p) for p in e["loc"] if not isinstance(p, int) and "[" not in str(p))


def validation_message(exc: ValidationError) -> str:
    errors = exc.errors()
    literal: dict[str, tuple[object, list[str]]] = {}   # a Union of Literals reports each branch: one line for all
    for e in errors:
        if e["type"] == "literal_error" and _literal_path(e):
            literal.setdefault(_literal_path(e), (e.get("input"), []))[1].extend(
                v.strip(" '") for v in re.split(r",| or ", e["ctx"]["expected"]) if v.strip(" '"))
    parts = [f"{_flag(field.split('.')[0])}: give one of {', '.join(allowed)} (got {got!r})"[:300]
             for field, (got, allowed) in literal.items()]
    for e in errors:
        if e["type"] == "literal_error" and _literal_path(e) in literal:
            continue
        field = ".".join(str(p) for p in e["loc"] if not isinstance(p, int))
        msg = e["msg"].removeprefix("Value error, ")
        if not field:    # a check across fields: its message names them
            parts.append(msg[:300])
            continue
        parts.append(f"{_flag(field.split('.')[0])}: {msg} (got {e.get('input')!r})"[:300])
    return "; ".join(parts)


def _runtime(runtime, phase: str) -> tuple[RuntimeSpec, str | None]:
    if isinstance(runtime, RuntimeSpec):
        return runtime, None
    note = None
    if runtime is None:  # a transcription is estimated as whisper.cpp runs it; everything else as eager PyTorch
        runtime = TRANSCRIBE_RUNTIME if phase == "transcribe" else "eager"
        if phase == "transcribe":
            note = (f"--runtime not given: {TRANSCRIBE_RUNTIME} (whisper.cpp's CUDA backend); ggml-vulkan and eager "
                    "(HF transformers) are the others")
    runtimes = all_runtimes()
    if runtime not in runtimes:
        raise catalog.UnknownNameError("runtime", runtime, sorted(runtimes),
                                       f"Choose one of: {', '.join(sorted(runtimes))}.")
    return runtimes[runtime], note


def quantized_training_note(config: dict) -> str | None:
    """The note for training a quantized checkpoint (config.json's quantization_config), which aisim trains in the
    precision's dtype; None for an unquantized one."""
    if not isinstance(config.get("quantization_config"), dict):
        return None
    method = config["quantization_config"].get("quant_method", "quantized")
    return (f"training: the checkpoint's {method} weights are trained in the precision's dtype (its "
            "quantization_config left out; quantized training is not modelled)")


def _calibration(choice, dev: Device) -> tuple[CalibrationSpec, str | None]:
    """auto: the GPU's calibration file (user directory first), else the default rules; none: the datasheet rules
    only (hardware_specs/calibration/default.yaml); a path or object: that calibration, whatever GPU it was
    measured on (the leave-one-GPU-out transfer)."""
    if isinstance(choice, CalibrationSpec):
        cal, where = choice, "given object"
    elif choice == "auto":
        return calibration_for(dev.gpu.name, dev.gpu.architecture), None
    elif choice == "none":
        return calibration_for(dev.gpu.name, dev.gpu.architecture, default=True), (
            "--calibration none: the documented default rules (hardware_specs/calibration/default.yaml), no measured "
            "calibration")
    else:
        path = Path(choice).expanduser()
        if not catalog.path_exists(path, "calibration", Path.is_file):
            raise AisimError(f"--calibration {str(choice)!r}: no such file (from {Path.cwd()}); give auto, none, or "
                             "the path of a calibration YAML")
        cal = calibration_file(path)
        if cal is None:
            raise AisimError(f"--calibration {str(choice)!r} is a host file (aisim calibrate --host-only): pass it "
                             "as --host")
        where = str(path)
    measured_on = "" if cal.device == dev.gpu.name else f", measured on {cal.device}, applied to {dev.gpu.name}"
    return cal, f"--calibration {where}{measured_on}"


def _host(choice, cal: CalibrationSpec) -> tuple[CalibrationSpec, str | None]:
    """The calibration with a host file's CPU costs (eager dispatch, framework scale) in place of its own."""
    if choice is None:
        return cal, None
    if isinstance(choice, HostSpec):
        host, where = choice, "given object"
    else:
        path = Path(choice).expanduser()
        if not catalog.path_exists(path, "host", Path.is_file):
            raise AisimError(f"--host {str(choice)!r}: give the path of a host YAML written by "
                             "`aisim calibrate --host-only`")
        data = load_yaml(path)
        if "device" in data:
            raise AisimError(f"--host {str(choice)!r} is a calibration file (it names a device): pass it as "
                             "--calibration; a host file comes from `aisim calibrate --host-only`")
        host, where = parse_spec(HostSpec, data, path), str(path)
    measured = host.provenance.get("cpu") or host.provenance.get("hostname")
    return host.apply(cal), f"--host {where}: eager CPU costs of {measured or 'that host'} replace the calibration's"


def resolve_power_mode(gpu, cal, mode: str | None, limit_w: float | None,
                       clock_mhz: float | None) -> tuple[PowerMode | None, str | None]:
    """The power mode to apply: a named mode of the GPU's spec file, overridden by an explicit limit or clock."""
    from .cost.energy import waiting_power_w

    named = None
    if mode is not None:
        modes = gpu.power_modes
        if mode not in modes:
            raise catalog.UnknownNameError("power mode", mode, sorted(modes),
                                           (f"{gpu.name} defines: {', '.join(sorted(modes))}; or give "
                                            if modes else f"{gpu.name}'s spec names no power modes: give ")
                                           + "--power-limit W / --gpu-clock MHz")
        named = modes[mode]
    limit = limit_w if limit_w is not None else (named.power_limit_w if named else None)
    clock = clock_mhz if clock_mhz is not None else (named.gpu_clock_mhz if named else None)
    if limit is None and clock is None:
        return None, (f"power mode {mode}: full clocks and board power ({named.source})" if named else None)
    _check_power(gpu, waiting_power_w(gpu, cal), limit, clock)
    text = (f"power mode{' ' + mode if mode else ''}: " +
            (f"power limit {limit:g} W (board {gpu.board_power_w:g} W)" if limit is not None else "") +
            (", " if limit is not None and clock is not None else "") +
            (f"GPU clock capped at {clock:g} MHz (boost {gpu.boost_clock_mhz:g} MHz)" if clock is not None else "") +
            "; compute-bound kernels slow with the clock below the one they ran at (boost, or for GEMMs the board "
            "limit holds, the clock of their calibration loops), memory-bound ones keep their time until their "
            "compute floor overtakes (aisim.cost.power)" +
            ("; their power falls with the SM clock as if HBM drew none of its own: a limit near the idle draw "
             "leaves memory-bound steps optimistic in time and power (unmeasured)" if limit is not None else "") +
            (f"; {named.source}" if named else ""))
    return PowerMode(limit, clock), text


CONFIG_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
TRAIN_PHASES = ("train", "forward-backward")
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS: model types vLLM never runs in fp16 (numerical instability)
FP16_UNSUPPORTED_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4", "plamo2"})


def uneven_stages_note(config: dict, pp: int, phase: str, runtime: str) -> str | None:
    """Pipeline stages over a layer count pp does not divide (DeepSeek-V3's 61 at pp 2): the stages hold one layer
    more or less (vLLM: get_pp_indices; Megatron training: --decoder-first/last-pipeline-num-layers); the step is
    priced as pp stages of ceil(layers / pp) layers (graph.extract._trace_scaled), the slowest stage pacing the
    pipeline, their weights (and training states) as the heaviest stage's (step.stage_memory, step.state_groups)."""
    if pp <= 1:
        return None
    from .graph.build import layer_count
    from .graph.engine import moe_layer_count

    layers = layer_count(config)
    if not layers % pp:
        return None
    big, small = -(-layers // pp), layers // pp
    train = phase in TRAIN_PHASES
    who = "vLLM's stages" if runtime == "vllm" and not train else "the stages"
    how = ("as Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers set them" if train
           else "as vLLM splits them: vllm/distributed/utils.py get_pp_indices")
    moe = moe_layer_count(config)
    dense = layers - moe if moe else 0
    return (f"--pp {pp} over {layers} layers: {who} hold {small} or {big} layers ({how}); priced as {pp} stages "
            f"of {big}"
            + (f", each holding as many MoE layers as the heaviest (the {dense} dense layers sit in the first)"
               if dense else ""))


def checkpoint_dtype(config: dict) -> tuple[object, str | None]:
    """config.json's dtype (transformers 5's key, else the older torch_dtype, else its text_config's) and aisim's name
    for it (None where it has none, a per-sub-config dict, or one aisim does not run)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    raw = config.get("dtype") or config.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
    return raw, CONFIG_DTYPES.get(str(raw).lower()) if raw else None


def auto_dtype(config: dict, rt: RuntimeSpec, gpu) -> tuple[str, str]:
    """--dtype auto, as the engine resolves it, and the note that says how.

    An engine that checks the GPU's dtypes (RuntimeSpec.min_compute_capability: vLLM) follows vLLM's
    ``_resolve_auto_dtype`` (vllm/config/model.py): the GPU's dtypes in its order (vllm/platforms/cuda.py
    supported_dtypes: bf16, fp16, fp32 from compute capability 8.0; fp16, fp32 below), less fp16 for the model types
    that refuse it; a float32 checkpoint runs in the first of them; a checkpoint dtype the GPU lacks (bf16 on a V100
    or T4) runs in the first of them too, with vLLM's warning. Other runtimes load as transformers'
    ``from_pretrained(dtype="auto")`` does: config.json's torch_dtype, float32 where it has none."""
    raw, given = checkpoint_dtype(config)
    source = (f"config.json's torch_dtype {raw}" if given else
              f"config.json's torch_dtype {raw} is none of {', '.join(CONFIG_DTYPES)}: float32" if raw else
              "no torch_dtype in config.json: float32")
    if not rt.min_compute_capability:
        chosen = given or "fp32"
        return chosen, (f"--dtype auto on {gpu.name}: {chosen} ({source}, as transformers' "
                        "from_pretrained(dtype=\"auto\") loads it)")
    need = rt.min_compute_capability.get("bf16")
    have = _capability(gpu.compute_capability)
    bf16 = gpu.vendor != "nvidia" or not need or have is None or have >= _capability(need)
    supported = [d for d in ("bf16", "fp16", "fp32") if (d != "bf16" or bf16)
                 and (d != "fp16" or config.get("model_type") not in FP16_UNSUPPORTED_MODEL_TYPES)]
    wanted = given or "fp32"
    chosen = supported[0] if wanted == "fp32" or wanted not in supported else wanted
    unstable = wanted == "fp16" and config.get("model_type") in FP16_UNSUPPORTED_MODEL_TYPES
    why = ("" if chosen == wanted else
           f"; {rt.name} runs a float32 checkpoint in {chosen}" if wanted == "fp32" else
           f"; vLLM never runs {config.get('model_type')} in fp16 (numerical instability): {chosen}" if unstable else
           f"; {gpu.name} (compute capability {gpu.compute_capability}) has no {wanted}: {rt.name} casts to {chosen}, "
           "with a warning")
    return chosen, (f"--dtype auto on {gpu.name}: {chosen} ({source}{why}; vLLM's _resolve_auto_dtype, "
                    "vllm/config/model.py)")


def checkpoint_quant(config: dict, quant: str) -> tuple[str, str | None]:
    """--quant none of a checkpoint stored quantized: its own weights, as the engines load them (vLLM and
    transformers read config.json's quantization_config): fp8 (DeepSeek-V3's block-scaled e4m3) -> fp8; AWQ and
    GPTQ of 4 bits -> int4, GPTQ of 8 -> int8; another method gets a note. MXFP4 experts (gpt-oss) are handled per expert tensor (graph.engine.moe_routing). A
    --quant given explicitly is kept."""
    q = config.get("quantization_config") or {}
    if not isinstance(q, dict):
        raise AisimError(f"config.json's quantization_config is a {type(q).__name__}, not an object with a "
                         "quant_method: fix the config (or remove the key for a 16-bit checkpoint)")
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits", 4)
    found = ("fp8" if method == "fp8" else "int4" if method in ("awq", "gptq") and bits == 4 else
             "int8" if method == "gptq" and bits == 8 else None)
    if quant != "none" or not method or method == "mxfp4":
        return quant, None
    if found is None:
        return quant, (f"config.json's quantization_config (quant_method {method}) is not read: the weights are "
                       "priced at --dtype; give --quant fp8, int8 or int4 for a quantized checkpoint")
    return found, (f"--quant {found}: the checkpoint's own weights (config.json quantization_config: quant_method "
                   f"{method}), as vLLM and transformers load them; for a 16-bit deployment of the model give a "
                   "config.json without quantization_config")


def _check_capability(rt, gpu, dtype: str, quant: str, config: dict | None = None) -> None:
    """The engine refuses a dtype or quantization the GPU's compute capability lacks (RuntimeSpec
    min_compute_capability; NVIDIA GPUs only), a checkpoint's MXFP4 experts (``config``'s quantization_config,
    as loaded for inference) included; every refusal in one line."""
    if gpu.vendor != "nvidia" or not rt.min_compute_capability:
        return
    have = _capability(gpu.compute_capability)
    from .graph.engine import mxfp4_experts

    mxfp4 = mxfp4_experts(config or {})   # MXFP4 experts stay MXFP4 whatever --quant says
    missing = [(what, need, hint) for what, given, hint in (("bf16", dtype == "bf16", "--dtype fp16"),
                                                            ("fp8", quant == "fp8", "--quant int8 or int4"),
                                                            ("mxfp4", mxfp4, "a --model whose config.json has no MXFP4 quantization_config"))
               if given and (need := rt.min_compute_capability.get(what)) and have is not None
               and have < _capability(need)]
    if missing:
        raise AisimError(f"runtime {rt.name} runs " + " and ".join(f"{what} on compute capability {need} or newer"
                                                                   for what, need, _ in missing)
                         + f"; {gpu.name} has {gpu.compute_capability}: give "
                         + " and ".join(hint for *_, hint in missing) + ", or another GPU")


def _capability(text: str) -> tuple[int, int] | None:
    """'8.9' -> (8, 9), '9.0a' -> (9, 0); None where the spec's string does not start with MAJOR.MINOR (a user
    GPU's 'sm_75': not checked)."""
    import re

    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else None


MIN_CLOCK_FRACTION = 0.1  # below a tenth of the boost clock no GPU runs (DVFS tables start around 200-300 MHz)


def _check_power(gpu, idle_w: float, limit: float | None, clock: float | None) -> None:
    for value, flag in ((limit, "--power-limit"), (clock, "--gpu-clock")):
        if value is not None and not math.isfinite(value):
            raise AisimError(f"{flag} must be a finite number (got {value})")
    if limit is not None and gpu.min_power_limit_w is not None and limit < gpu.min_power_limit_w:
        raise AisimError(f"power limit {limit:g} W is below the lowest {gpu.name} accepts ({gpu.min_power_limit_w:g} "
                         f"W, nvidia-smi power.min_limit); give --power-limit {gpu.min_power_limit_w:g} to "
                         f"{gpu.board_power_w:g}")
    if limit is not None and limit <= idle_w:
        raise AisimError(f"power limit {limit:g} W is at or below {gpu.name}'s waiting power ({idle_w:g} W); give a "
                         f"higher --power-limit (board power {gpu.board_power_w:g} W)")
    if limit is not None and limit > gpu.board_power_w:
        raise AisimError(f"power limit {limit:g} W is above {gpu.name}'s board power ({gpu.board_power_w:g} W); "
                         f"give at most {gpu.board_power_w:g}")
    low = MIN_CLOCK_FRACTION * gpu.boost_clock_mhz
    if clock is not None and not low <= clock <= gpu.boost_clock_mhz:
        raise AisimError(f"--gpu-clock {clock:g} MHz: give a clock between {low:g} and {gpu.name}'s boost clock "
                         f"({gpu.boost_clock_mhz:g} MHz)")


# runtimes that run the model as Hugging Face transformers does (eager, CUDA-graphed StaticCache, continuous batching)
TRANSFORMERS_RUNTIMES = ("eager", "graphs", "transformers-cb")
def fp8_block_scaled(config: dict, runtime: str) -> bool:
    """Whether W8A8 fp8 runs block-scaled: a checkpoint with 128 x 128 weight blocks (quantization_config
    weight_block_size, DeepSeek-V3's), which vLLM runs with per-token-group activation quantization (one kernel,
    per_token_group_quant_fp8) and w8a8_block_fp8_matmul, or any fp8 under transformers (FineGrainedFP8, whose
    default weight_block_size is 128 x 128: integrations/finegrained_fp8.py, act_quant then the block GEMM). Else
    vLLM's dynamic per-tensor scale (scaled_fp8_quant: an absmax reduction, then the scaled cast)."""
    return bool((config.get("quantization_config") or {}).get("weight_block_size")) or runtime in TRANSFORMERS_RUNTIMES


def _fp8_costed(block: bool) -> str:
    return ("W8A8 linears costed as " + ("per-token-group (1 x 128) activation quantization (1 kernel) with 128 x 128 "
                                         "block-scaled fp8 weights" if block
                                         else "dynamic per-tensor activation quantization (2 kernels)")
            + ", then an fp8 x fp8 GEMM at the fp8 rate")


def _fp8_engine(runtime: str, config: dict) -> str:
    """What ``--quant fp8`` means on this runtime, and how it is costed."""
    costed = _fp8_costed(fp8_block_scaled(config, runtime))
    if runtime == "vllm":
        return f"{costed}, as vLLM's Fp8LinearMethod runs them"
    if runtime in TRANSFORMERS_RUNTIMES:
        return ("transformers' FineGrainedFP8 (integrations/finegrained_fp8.py fp8_linear: 128 x 128 block-scaled fp8 "
                "weights, per-token-group activation quantization, then a DeepGEMM or Triton fp8 GEMM); "
                f"{costed}")
    return f"{costed} (vLLM's Fp8LinearMethod; {runtime}'s own fp8 kernels are not modelled apart)"


HF_RUNTIMES = ("eager", "graphs", "transformers-cb", "kernel-sum")    # transformers' own modelling code runs


def _precision_notes(dev: Device, dtype: str, quant: str, plan: ParallelPlan, config: dict,
                     rt: RuntimeSpec, phase: str = "forward") -> list[str]:
    from .graph.engine import expert_count, mxfp4_experts, sliding_windows, windowed_layers

    out, runtime = [], rt.name
    experts = expert_count(config)
    packed = mxfp4_experts(config)
    if packed:
        out.append("MoE expert weights in MXFP4 as the checkpoint stores them (4.25 bits per weight, whatever "
                   "--quant says; dequantized inside the MoE kernel, their grouped GEMMs costed at the 16-bit rate)")
    if dtype in ("bf16", "tf32") and not getattr(dev.gpu.peak_flops_per_s, dtype):
        out.append(f"{dev.gpu.name} has no {dtype} units: its matmuls are costed at the "
                   f"{'fp16' if dtype == 'bf16' else 'fp32'} rate (PyTorch emulates or falls back; real runs may "
                   "be slower)")
    if quant == "bitsandbytes-int8":
        out.append("--quant bitsandbytes-int8: every linear layer runs LLM.int8's MatMul8bitLt (input quantization "
                   "with outlier split, 2 host syncs, col32 transform, int8 GEMM, dequantization, fp16 outlier "
                   "matmul; aisim.graph.engine); the LM head stays 16-bit")
    elif quant == "fp8" and dev.gpu.peak_flops_per_s.fp8:
        fused = "fused_moe" in rt.fusions
        experts_fp8 = ("" if packed or not experts else "; MoE experts fp8 x fp8 (vLLM's Fp8MoEMethod, use_fp8_w8a8), "
                       "each after its activation's quantization, on the dense fp8 GEMM curve (no fp8 grouped-GEMM "
                       "table is measured)" if fused
                       else "; MoE expert weights stored fp8 (their grouped GEMMs at the 16-bit rate)")
        out.append(f"--quant fp8 on {dev.gpu.name} with {runtime}: {_fp8_engine(runtime, config)}{experts_fp8}; "
                   "embeddings and the LM head 16-bit")
    elif quant == "fp8":
        out.append(f"--quant fp8: {dev.gpu.name} has no fp8 tensor cores: weight-only fallback (fp8 weights "
                   "dequantized to 16-bit inside the GEMM, as vLLM's FP8 Marlin kernel on Ampere); GEMMs run at the "
                   f"{dtype} rate")
    elif quant != "none":
        out.append(f"--quant {quant}: linear weights read at {quant} width (weight-only; the LM head 16-bit); each "
                   "GEMM priced at the 16-bit kernel's efficiency on the fewer bytes, never above the bandwidth the "
                   "largest copies and adds reach, its dequantization taken as free: an upper bound for Marlin/"
                   "AWQ-class kernels")
    if experts and dtype == "fp16" and runtime in HF_RUNTIMES:
        out.append("MoE in fp16: transformers' grouped_mm experts take bf16 only (torch._grouped_mm), so an HF run "
                   "needs --dtype bf16; the expert GEMMs are costed in fp16 as serving engines' fused MoE kernels "
                   "run them")
    if experts and plan.ep > 1:
        how = ("Megatron's expert model parallel group" if phase in TRAIN_PHASES
               else "vLLM --enable-expert-parallel")
        out.append(f"MoE: {experts} experts spread over {plan.ep} GPUs ({experts // plan.ep} per GPU; {how}), expert "
                   "outputs " + ("combined by all-to-all" if plan.ep > plan.tp
                                 else "all-reduced over the tensor-parallel GPUs"))
    elif experts and plan.tp > 1:
        out.append(f"MoE: every expert's intermediate dimension split over the {plan.tp} tensor-parallel GPUs "
                   "(Megatron's scheme per expert, as vLLM's FusedMoE shards without expert parallelism), outputs "
                   "all-reduced")
    windows = sliding_windows(config)
    if windows:
        layers = config.get("num_hidden_layers") or config.get("n_layer") or 0
        windowed = windowed_layers(config, layers)
        which = f"{windowed} of its {layers} layers attend" if windowed < layers else "every layer attends"
        out.append(f"sliding-window attention: {which} over and cache at most the last {windows['window']:,} "
                   "tokens (the KV cache and those layers' attention are sized by the window)")
    if rt.serving is not None and experts and experts >= 64 and config.get("kv_lora_rank"):
        fp8 = quant == "fp8" or (config.get("quantization_config") or {}).get("quant_method") == "fp8"
        out.append("fine-grained MoE with MLA (DeepSeek-V3 class) under a serving engine is unmeasured and likely "
                   "optimistic: the one published figure found, SGLang v0.4.1.post2 on DeepSeek-V3 (sgl-project/"
                   "sglang #2643), is 2-6x slower than aisim at batch 1-32 (docs/model.md, known gaps)"
                   + ("; its fp8 MoE GEMMs run on the dense fp8 curve here" if fp8 else ""))
    return out


# ends the note an estimate under a serving engine's runtime carries; serve and plan serve, which run the
# engine's scheduler, leave it out (serving_notes)
SERVE_PRICES_ENGINE = "priced by `aisim serve`, which runs the engine's scheduler"


def serving_notes(sc: Scenario) -> list[str]:
    """The scenario's notes as `aisim serve` says them: without the one that points to `aisim serve`."""
    return [a for a in sc.assumptions if not a.endswith(SERVE_PRICES_ENGINE)]


def _runtime_notes(rt: RuntimeSpec, dev: Device, dtype: str) -> list[str]:
    out = []
    backend = rt.backend_efficiency(dev.gpu, dtype)
    cores = "yes" if dev.gpu.has_tensor_cores else "no"
    if backend is not None:
        out.append(f"runtime {rt.name} on {dev.gpu.architecture} (tensor cores: {cores}): large GEMMs at "
                   f"{backend.gemm_fraction_of_peak:.0%} of the {dtype} peak, memory-bound kernels at "
                   f"{backend.memory_fraction_of_bw:.0%} of bandwidth ({backend.source})")
    elif rt.efficiency and rt.name.startswith("ggml"):
        out.append(f"runtime {rt.name} has no documented efficiency for {dev.gpu.name} ({dev.gpu.architecture}, "
                   f"tensor cores: {cores}): its kernels are costed at the device calibration's efficiencies "
                   "(PyTorch's kernels); only its dispatch, attention, KV cache and beam settings apply")
    if rt.static_cache:
        out.append(f"runtime {rt.name}: HF's StaticCache + torch.compile as transformers documents it: every decode "
                   "step attends over the whole static cache with a mask, so HF's SDPA path copies K and V to every "
                   "query head (repeat_kv.copy) and runs the masked kernel; --static-cache-len sets the cache "
                   "(default: the context). An engine that reads GQA natively from a paged cache: --runtime vllm")
    serving = rt.serving
    if serving is not None and (serving.attention == "packed-mask" or serving.prepare_s
                                or serving.scheduler_overhead_s):
        out.append(f"runtime {rt.name}: this is one forward of the engine's kernels; its per-step work around it "
                   f"(batch preparation, the scheduler, {serving.attention} attention over the packed batch) is "
                   + SERVE_PRICES_ENGINE)
    return out


def calibration_note(sc: Scenario) -> str | None:
    """Said with every estimate whose calibration is not a measurement."""
    cal = sc.calibration
    if cal.measured or sc.default_rules_asked:   # asked for: its own note says so once
        return None
    source = ("the documented default rules (hardware_specs/calibration/default.yaml)" if cal.device == "default"
              else f"documented rules for this GPU (hardware_specs/calibration/{cal.device}.yaml)")
    foreign = (f"; those rules are written against NVIDIA GPUs (the H100 SXM datasheet, NVIDIA measurements), so "
               f"on this {sc.device.gpu.vendor.upper()} GPU the figures are rough (its spec file's notes)"
               if sc.device.gpu.vendor != "nvidia" else "")
    return (f"{sc.device.gpu.name} has no measured calibration: efficiencies and overheads are {source}, not "
            f"measurements{foreign}; run `aisim calibrate` on that GPU to measure them")


_SPEC_HASHES: dict[int, tuple[object, str]] = {}


def _hash(obj) -> str:
    """Content hash of a spec object or config, memoised per object (specs are frozen; a calibration with its GEMM
    table is large, and a warm estimate must not re-serialise it)."""
    found = _SPEC_HASHES.get(id(obj))
    if found is not None and found[0] is obj:
        return found[1]
    data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    if len(_SPEC_HASHES) > 4096:
        _SPEC_HASHES.clear()
    _SPEC_HASHES[id(obj)] = (obj, digest)   # the object is kept alive, so its id is not reused
    return digest


def _key(config, dev: Device, cal: CalibrationSpec, rt: RuntimeSpec, power, plan: ParallelPlan, dtype, quant,
         with_loss, optimizer, kv_dtype: str = "auto") -> str:
    blob = json.dumps([_hash(config), _hash(dev.gpu), dev.count, _hash(dev.interconnect), _hash(cal), _hash(rt),
                       None if power is None else [power.power_limit_w, power.gpu_clock_mhz], plan.model_dump(),
                       dtype, quant, with_loss, optimizer, kv_dtype], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
