"""The public API: ``aisim.estimate(model=..., device=...)`` -> results.Estimate, a thin typed front.

It validates the request (strict pydantic: a wrong type is an error, never a silent coercion), resolves the
Scenario once (aisim.scenario), and runs the study the workload names (aisim.studies). The CLI only renders.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import ConfigDict, Field

from .results import Estimate
from .scenario import ScenarioRequest, build_request, resolve_scenario
from .specs import CalibrationSpec, Device, HostSpec, RuntimeSpec
from .studies.common import TOP_OPS
from .workload import MAX_AUDIO_S, MAX_BATCH, MAX_TOKENS, Phase, StepShape, TrainPlan, Workload

__all__ = ["estimate", "serve_bench", "estimate_transcript", "EstimateRequest"]

DEFAULT_GEN = 128   # new tokens of a generate workload when --gen is not given


class EstimateRequest(ScenarioRequest):
    """Everything ``estimate`` takes: the scenario, plus the workload."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True,
                              allow_inf_nan=False)
    workload: Phase = "forward"
    batch: int = Field(1, ge=1, le=MAX_BATCH)
    seq: int = Field(1024, ge=1, le=MAX_TOKENS)
    gen: Optional[int] = Field(None, ge=1, le=MAX_TOKENS, description="generate: new tokens (default 128)")
    step_tokens: int = Field(1, ge=1, le=MAX_TOKENS)
    static_cache_len: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    audio_s: Optional[float] = Field(None, gt=0, le=MAX_AUDIO_S)
    beam: int = Field(5, ge=1, le=64)
    transcript_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS)
    windows: Optional[int] = Field(None, ge=1, le=MAX_AUDIO_S // 30 + 1)
    transcript_counts: Optional[Any] = None
    top_ops: Optional[int] = Field(TOP_OPS, ge=0)
    train: Optional[TrainPlan] = Field(None, description="train: the training plan (precision, ZeRO/FSDP, "
                                       "recompute, micro-batching, pipeline schedule); None: from dtype")
    nodes: Optional[int] = Field(None, ge=1, le=100_000, description="train: nodes of a multi-node system")
    token_budget: Optional[float] = Field(None, gt=0, description="train: tokens to train on (time to train)")


def estimate(model: Union[str, Path], device: Union[str, Path, Device], workload: Phase = "forward",
             batch: int = 1, seq: int = 1024, gen: Optional[int] = None,
             dtype: Literal["fp32", "tf32", "fp16", "bf16", "auto"] = "fp16", tp: Optional[int] = None, pp: int = 1,
             dp: Optional[int] = None, tp_scope: Literal["all", "full", "layers", "mlp", "attention"] = "all",
             runtime: Union[str, RuntimeSpec, None] = None,
             calibration: Union[str, Path, CalibrationSpec] = "auto", with_loss: bool = False,
             optimizer: Literal["adamw", "sgd"] = "adamw",
             quant: Literal["none", "bitsandbytes-int8", "int8", "fp8", "int4"] = "none",
             top_ops: Optional[int] = TOP_OPS, audio_s: Optional[float] = None, beam: int = 5,
             transcript_tokens: Optional[int] = None, windows: Optional[int] = None,
             power_limit_w: Optional[float] = None, gpu_clock_mhz: Optional[float] = None,
             power_mode: Optional[str] = None, step_tokens: int = 1, transcript_counts: Any = None, ep: int = 1,
             kv_dtype: Literal["auto", "fp16", "bf16", "fp8"] = "auto", train: Optional[TrainPlan] = None,
             nodes: Optional[int] = None, token_budget: Optional[float] = None,
             static_cache_len: Optional[int] = None, host: Union[str, Path, HostSpec, None] = None) -> Estimate:
    """Estimate runtime, peak memory per GPU, energy and throughput of one workload.

    Args:
        model: a shipped name (``opt-6.7b``, ``llama-3-70b``, ``meta-llama/Meta-Llama-3-8B``) or a path to an HF
            config.json (or its folder).
        device: a GPU name (``h100``), ``NAMExN`` for N GPUs in one host (``a6000x8``), a system name, or a path to
            a GPU or system YAML file.
        workload: forward, prefill, decode, generate, encode, forward-backward, train or transcribe.
        batch: sequences per step (the global batch, split over data-parallel replicas).
        seq: input length (forward, prefill, forward-backward, train), or the context of a decode step (cached
            tokens plus the new one).
        gen: generate: new tokens (a prefill, then gen - 1 decode steps).
        dtype: compute dtype of weights and activations; auto: as the runtime picks it from config.json
            (scenario.auto_dtype).
        tp: tensor parallel degree; None: the largest the model's dimensions allow over the device's GPUs.
        pp: pipeline parallel degree (stages run one after another; no micro-batching).
        dp: data parallel degree; None: GPUs / (tp x pp).
        tp_scope: what TP shards: all (attention + MLP; the vocabulary too under vllm and in training, as
            Megatron), full (+ vocab-parallel LM head), layers (attention + MLP, the vocabulary replicated), mlp,
            attention.
        runtime: engine profile name (``aisim list runtimes``) or a RuntimeSpec; None: eager (ggml-cuda for
            transcribe).
        calibration: auto (the GPU's calibration file, else the default rules), none (datasheet rules only), or
            the path of a calibration YAML (measured on this or another GPU).
        host: a host YAML (``aisim calibrate --host-only``) or HostSpec: that machine's eager CPU costs replace
            the calibration's (the GPU curves stay); None: the calibration's own.
        with_loss: forward includes the LM loss over the full logits.
        optimizer: train: adamw or sgd.
        quant: weight quantization: none, bitsandbytes-int8, int8, fp8 or int4.
        top_ops: how many op rows to return (None: all).
        audio_s: transcribe: seconds of audio.
        beam: transcribe: beam size.
        transcript_tokens: transcribe: output tokens (default: an assumed speech rate).
        windows: transcribe: 30 s windows encoded (default ceil(audio_s / 30)).
        power_limit_w: board power limit in W.
        gpu_clock_mhz: GPU core clock cap in MHz.
        power_mode: a power mode named in the GPU's spec file.
        step_tokens: decode of an encoder-decoder model: new tokens per sequence in the call.
        transcript_counts: transcribe: the decoder work as an ``aisim.studies.transcribe.TranscriptCounts``.
        ep: MoE expert parallel degree (experts spread over ep of the stage's tp x dp GPUs).
        kv_dtype: KV cache element type: auto (the model dtype), fp16, bf16 or fp8 (vLLM --kv-cache-dtype fp8).
        train: train: an ``aisim.workload.TrainPlan`` (precision mode, ZeRO stage / FSDP, recompute, micro-batch,
            gradient accumulation, pipeline schedule, DDP bucket); None: ``dtype``'s true precision (fp16:
            16-true; the CLI, whose --dtype has no default, takes bf16-mixed without one), plain DDP.
        nodes: train: nodes of a multi-node system (a100x8-hdr, h100x8-ndr; or the name SYSTEMxN).
        token_budget: train: tokens to train on, for the time to train.
        static_cache_len: decode/generate under a static-cache runtime (graphs): HF StaticCache's max_cache_len,
            the keys every decode step attends over; None: decode --seq, generate --seq + --gen (as HF generate
            sizes it: max_length = prompt + max_new_tokens).

    Returns:
        An ``aisim.results.Estimate``; a configuration that does not fit has ``fits=False``, no times and a
        ``not_fit_reason`` with the numbers.

    Raises:
        aisim.errors.AisimError: bad input, with a one-line message that says what to do.
    """
    req = build_request(EstimateRequest, **{k: v for k, v in locals().items()})
    return checked(run(req))


def checked(result):
    """The result, if every number in it is finite and a configuration that fits has a positive runtime; else an
    AisimError (an estimate with NaN or infinity is a wrong answer, never one to print)."""
    from .errors import AisimError

    bad = _non_finite(result.model_dump())
    if bad:
        raise AisimError(f"the estimate came out non-finite at {bad}; the inputs are beyond what aisim models "
                         "(please report it with the command line)")
    for row in getattr(result, "rows", None) or [result]:
        runtime_ms = getattr(row, "runtime_ms", None)
        if getattr(row, "fits", False) and runtime_ms is not None and not runtime_ms > 0:
            raise AisimError(f"the estimate came out with runtime {runtime_ms} ms; please report it")
    return result


def _non_finite(data, where: str = "") -> str | None:
    if isinstance(data, float) and not math.isfinite(data):
        return where or "result"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = _non_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def run(req: EstimateRequest) -> Estimate:
    """Resolve the request's scenario once and run the study its workload names."""
    from .errors import AisimError
    from .studies.single import single_step

    transcript = (req.audio_s, req.transcript_tokens, req.windows, req.transcript_counts)
    if req.workload != "transcribe" and transcript != (None,) * 4:
        raise AisimError("--audio-s, --tokens and --windows apply to --workload transcribe only")
    if req.step_tokens != 1 and (req.workload != "decode" or req.step_tokens > req.seq):
        raise AisimError(f"--step-tokens {req.step_tokens}: new tokens per row of a --workload decode call, at most "
                         f"--seq (the context after the step, {req.seq})")
    if req.static_cache_len is not None:
        need = req.seq + ((req.gen or DEFAULT_GEN) if req.workload == "generate" else 0)
        if req.workload not in ("decode", "generate"):
            raise AisimError(f"--static-cache-len applies to --workload decode or generate only (got --workload "
                             f"{req.workload}); drop it, or estimate the decode step")
        if req.static_cache_len < need:
            raise AisimError(f"--static-cache-len {req.static_cache_len} is shorter than the longest context ({need}): "
                             f"the static cache (--runtime graphs) holds every token; give at least {need}")
    _check_workload_options(req)
    scenario_fields = {k: getattr(req, k) for k in ScenarioRequest.model_fields}
    if req.workload != "train" and (req.train, req.nodes, req.token_budget) != (None, None, None):
        raise AisimError("the training plan, --nodes and --token-budget apply to --workload train only")
    if req.workload == "train":
        return _train(req, scenario_fields)
    sc = resolve_scenario(ScenarioRequest.model_construct(**scenario_fields), req.workload, req.batch)
    if req.static_cache_len is not None and not sc.runtime.static_cache:
        raise AisimError(f"--static-cache-len applies to a static-cache runtime (graphs); {sc.runtime.name} sizes "
                         "its own cache")
    if req.workload == "generate":
        from .studies.generate import generate

        result = generate(sc, req.batch, req.seq, req.gen or DEFAULT_GEN, req.static_cache_len)
    elif req.workload == "transcribe":
        from .studies.transcribe import transcribe

        w = sc.workload(StepShape(phase="forward")).model_copy(update={
            "phase": "transcribe", "audio_s": req.audio_s, "beam": req.beam,
            "transcript_tokens": req.transcript_tokens, "windows": req.windows})
        result = transcribe(sc, build_request(Workload, **w.model_dump()), req.transcript_counts)
    else:
        result = single_step(sc, StepShape(phase=req.workload, batch=req.batch, seq=req.seq,
                                           step_tokens=req.step_tokens, static_cache_len=req.static_cache_len))
    notes = [n for n in (_chunked_prefill_note(sc, req), _pipeline_note(sc)) if n]
    if notes:
        result = result.model_copy(update={"assumptions": [*result.assumptions, *notes]})
    return result if req.top_ops is None else result.model_copy(update={"top_ops": result.top_ops[:req.top_ops]})


def _pipeline_note(sc) -> str | None:
    """What an estimate with pipeline stages prices (step.step_cost): one batch through the stages in turn."""
    if sc.plan.pp <= 1:
        return None
    return (f"pipeline parallel {sc.plan.pp}: this step's batch goes through the {sc.plan.pp} stages one after "
            "another (no micro-batches in flight: `aisim serve --runtime vllm` keeps one per stage); each stage's "
            "time carries the traced embedding and LM head (the head's time counted once per stage), the sends "
            "between stages are not priced")


def _chunked_prefill_note(sc, req: EstimateRequest) -> str | None:
    """An engine with chunked prefill never runs a prompt step of more tokens than its max_num_batched_tokens:
    say so where the estimated step is larger (its time and activations are one step over every prompt token)."""
    from .studies.common import chunked_prefill_budget

    tokens = req.batch * req.seq
    budget = chunked_prefill_budget(sc, tokens) if req.workload in ("prefill", "forward", "generate") else None
    if budget is None:
        return None
    return (f"{sc.runtime.name} prefills at most {budget:,} tokens per step (chunked prefill, "
            f"max_num_batched_tokens): this prompt of {tokens:,} tokens runs as "
            f"{-(-tokens // budget)} steps, each holding that chunk's activations; the estimate "
            "is one step over every prompt token (`aisim serve --input-len N` runs the chunks)")


def _check_workload_options(req: EstimateRequest) -> None:
    """Options the workload would silently ignore are refused: quantized training is not modelled (the traced
    step runs in the precision mode's dtype), a training step keeps no KV cache, and the optimizer belongs to a
    training step."""
    from .errors import AisimError

    if req.workload == "train" and req.quant != "none":
        raise AisimError(f"--quant {req.quant}: quantized training is not modelled (aisim trains in the --precision "
                         "mode's dtype); drop --quant, or use --workload prefill, decode or generate for quantized "
                         "inference")
    if req.workload in ("train", "forward-backward") and req.kv_dtype != "auto":
        raise AisimError(f"--kv-dtype {req.kv_dtype}: a {req.workload} step keeps no KV cache; drop --kv-dtype (it "
                         "applies to --workload prefill, decode and generate)")
    if req.with_loss and req.workload not in ("forward", "forward-backward", "train"):
        raise AisimError(f"--with-loss applies to --workload forward, forward-backward or train (the LM loss over "
                         f"every position); a {req.workload} step computes no loss: drop --with-loss")
    if req.gen is not None and req.workload != "generate":
        raise AisimError(f"--gen applies to --workload generate only (new tokens after the prompt); drop it for "
                         f"{req.workload}")
    if req.workload != "train" and req.optimizer != "adamw":
        raise AisimError(f"--optimizer {req.optimizer} applies to --workload train only (a {req.workload} step runs "
                         "no optimizer); drop --optimizer or use --workload train")


# the runtimes a training step runs under (the others are inference engines: CUDA graphs, paged KV, ggml)
TRAIN_RUNTIMES = ("eager", "kernel-sum")


def _train(req: EstimateRequest, scenario_fields: dict) -> Estimate:
    """One optimizer step of the training plan (aisim.studies.train): precision sets the traced dtype."""
    from .studies.train import PRECISION_DTYPE, TrainRequest, default_precision, multi_node_device, train_estimate

    plan = req.train or TrainPlan(precision=default_precision(req.dtype, req.model))
    fields = dict(scenario_fields, device=multi_node_device(req.device, req.nodes),
                  dtype=PRECISION_DTYPE[plan.precision])
    sharding = (f"ZeRO stage {plan.stage}" if plan.fsdp == "none" else f"FSDP {plan.fsdp}") if plan.stage else None
    train_req = TrainRequest(batch=req.batch, seq=req.seq, plan=plan, token_budget=req.token_budget)
    result = None
    if sharding is None and req.tp is None and req.pp == 1 and req.dp is None:
        result = _ddp_first(fields, req.batch, train_req)
    if result is None:
        sc = resolve_scenario(ScenarioRequest.model_construct(**fields), "train", req.batch, sharding)
        _runtime_trains(sc)
        result = train_estimate(sc, train_req)
    return result if req.top_ops is None else result.model_copy(update={"top_ops": result.top_ops[:req.top_ops]})


def _ddp_first(fields: dict, batch: int, train_req) -> Estimate | None:
    """Plain DDP with no plan given: the fastest split of one node's GPUs into tensor parallel x data parallel whose
    replicas fit (tp 1: every GPU a DDP replica, as torchrun / Lightning train a model that fits one GPU; a larger
    tp where the replicas' gradient all-reduce or memory costs more than the tensor-parallel collectives), each
    costed; None where none fits or none applies (the caller's default: the most tensor parallelism a node takes, as
    Megatron)."""
    from . import catalog
    from .errors import AisimError
    from .studies.train import train_estimate

    first = resolve_scenario(ScenarioRequest.model_construct(**fields), "train", batch,
                             "DDP: data parallel first, each replica's step fits one GPU")
    if first.plan.tp > 1 or first.plan.gpus == 1:
        return None
    _runtime_trains(first)
    node = catalog.node_gpus(first.device)
    costed = {}
    for tp in (t for t in (1, 2, 4, 8, 16) if t <= node and node % t == 0):
        try:
            sc = first if tp == 1 else resolve_scenario(ScenarioRequest.model_construct(**{**fields, "tp": tp}),
                                                        "train", batch)
            result = train_estimate(sc, train_req)
        except AisimError:      # a degree the model's dims or the batch refuse, or micro-batching at this dp
            continue
        if result.fits:
            costed[tp] = (sc, result)
    if not costed:
        return None
    tp = min(costed, key=lambda t: costed[t][1].runtime_ms)
    sc, result = costed[tp]
    if len(costed) == 1 and tp == 1:
        return result
    times = ", ".join(f"tp {t} x dp {s.plan.dp}: {r.runtime_ms:,.1f} ms" for t, (s, r) in costed.items())
    return result.model_copy(update={"assumptions": [
        f"default plan: tensor parallel {tp} x data parallel {sc.plan.dp}, the fastest split of a node's GPUs whose "
        f"DDP replicas fit ({times}; --tp sets one)",
        *(a for a in result.assumptions if not a.startswith(("--dp not given", "default plan for")))]})


def _runtime_trains(sc) -> None:
    if sc.runtime.name not in TRAIN_RUNTIMES:
        from .errors import AisimError

        raise AisimError(f"--runtime {sc.runtime.name} is an inference runtime: a training step runs in eager "
                         f"PyTorch ({', '.join(TRAIN_RUNTIMES)}); drop --runtime")


def serve_bench(model: Union[str, Path], device: Union[str, Path, Device], shards: list[int], batches: list[int],
                seq: int = 1024, decode_len: int = 8, dtype: Literal["fp32", "tf32", "fp16", "bf16"] = "fp16",
                quant: Literal["none", "bitsandbytes-int8", "int8", "fp8", "int4"] = "none",
                runtime: Union[str, RuntimeSpec, None] = "tgi-2023", calibration: Union[str, Path] = "auto",
                max_batch_total_tokens: Optional[int] = None):
    """TGI's benchmark report (aisim.studies.serve_bench): prefill and decode latency and throughput for each
    shard count (tensor parallel, vocab-parallel head) and batch size. Rows that do not fit say why."""
    from .studies.serve_bench import ServeBenchRequest
    from .studies.serve_bench import serve_bench as study

    base = build_request(ScenarioRequest, model=model, device=device, dtype=dtype, quant=quant, runtime=runtime,
                         calibration=calibration)
    req = build_request(ServeBenchRequest, shards=shards, batches=batches, seq=seq, decode_len=decode_len,
                        max_batch_total_tokens=max_batch_total_tokens)
    return checked(study(base, req))


def estimate_transcript(model: Union[str, Path], device: Union[str, Path, Device], counts: Any,
                        runtime: Optional[str] = None, dtype: Literal["fp32", "tf32", "fp16", "bf16"] = "fp16",
                        power_mode: Optional[str] = None, power_limit_w: Optional[float] = None,
                        gpu_clock_mhz: Optional[float] = None) -> Estimate:
    """A transcription whose decoder work is given as counts (aisim.studies.transcribe.TranscriptCounts, e.g. from
    a whisper.cpp printout's runs)."""
    return estimate(model=model, device=device, workload="transcribe", dtype=dtype, runtime=runtime,
                    beam=counts.beam, transcript_counts=counts, power_mode=power_mode, power_limit_w=power_limit_w,
                    gpu_clock_mhz=gpu_clock_mhz)
