"""Serving benchmark in the shape of text-generation-inference's `text-generation-benchmark` report.

For each shard count (tensor parallel degree, vocab-parallel LM head as TGI shards it) and batch size:
prefill latency of batch x seq tokens, decode latency per step (the mean of the first and last of the
decode_len - 1 steps, linear in context) and in total, prefill throughput in requests/s (batch / prefill latency,
as TGI defines it) and decode throughput in tokens/s (batch / step latency). A batch that does not fit (weights,
KV cache and activations over the GPU's memory less the CUDA context, or batch x (seq + decode_len) over
max_batch_total_tokens when given) is
reported as not fitting with the numbers, where TGI's report shows NaN.

The default ``--runtime tgi-2023`` adds TGI 0.x's own per-step work (its request loop, full-vocabulary prefill
logits, a gRPC call per step: hardware_specs/runtimes/tgi-2023.yaml). Known inaccuracies: the estimate traces the
transformers implementation of the model, not TGI's own modeling code; tokenizer CPU time is not modelled.
"""
from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ..catalog import gpus_device, resolve_device, resolve_model
from ..errors import AisimError
from ..scenario import Scenario, ScenarioRequest, resolve_scenario
from ..step import step_cost
from ..workload import MAX_BATCH, MAX_TOKENS, StepShape
from .common import chunked_prefill_hint, not_fit_reason
from .generate import decode_steps
from .single import check_positions

SERVE_BENCH_NOT_FIT_HINT = "use more shards (--shards), a smaller --batch or --seq, --quant, or a GPU with more memory"


class ServeRow(BaseModel):
    batch: int
    fits: bool
    not_fit_reason: str | None = None
    prefill_ms: float | None = None
    decode_token_ms: float | None = None
    decode_total_ms: float | None = None
    prefill_throughput_requests_per_s: float | None = None
    decode_throughput_tokens_per_s: float | None = None
    memory_gb: float | None = None


class ServeShard(BaseModel):
    shards: int
    device: str
    rows: list[ServeRow]


class ServeBench(BaseModel):
    model: str
    device: str
    seq: int
    decode_len: int
    dtype: str
    quant: str
    runtime: str
    max_batch_total_tokens: int | None
    shards: list[ServeShard]
    assumptions: list[str]


class ServeBenchRequest(BaseModel):
    """TGI's benchmark grid: shard counts x batch sizes at one prompt length and decode length."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    shards: list[Annotated[int, Field(ge=1, le=64)]] = Field(min_length=1, max_length=64)
    batches: list[Annotated[int, Field(ge=1, le=MAX_BATCH)]] = Field(min_length=1, max_length=64)
    seq: int = Field(1024, ge=1, le=MAX_TOKENS)
    decode_len: int = Field(8, ge=2, le=MAX_TOKENS, description="1 token from prefill, then decode_len - 1 steps")
    max_batch_total_tokens: int | None = Field(None, ge=1)


def _row(sc: Scenario, batch: int, req: ServeBenchRequest) -> ServeRow:
    prefill = step_cost(sc, StepShape(phase="prefill", batch=batch, seq=req.seq))
    steps = req.decode_len - 1
    decode = decode_steps(sc, batch, req.seq + 1, steps)
    memory = max(prefill.memory.total_gb, decode.memory.total_gb)
    tokens = batch * (req.seq + req.decode_len)
    if req.max_batch_total_tokens is not None and tokens > req.max_batch_total_tokens:
        return ServeRow(batch=batch, fits=False, memory_gb=memory,
                        not_fit_reason=f"batch x (seq + decode) = {tokens} tokens > max_batch_total_tokens "
                                       f"{req.max_batch_total_tokens}")
    for mem, hint in ((prefill.memory, chunked_prefill_hint(sc, batch * req.seq)), (decode.memory, "")):
        reason = not_fit_reason(mem, sc.device.gpu.name, SERVE_BENCH_NOT_FIT_HINT)
        if reason:
            return ServeRow(batch=batch, fits=False, memory_gb=memory, not_fit_reason=reason + hint)
    step_ms = decode.runtime_s / steps * 1e3
    prefill_ms = prefill.runtime_s * 1e3
    return ServeRow(batch=batch, fits=True, memory_gb=memory, prefill_ms=prefill_ms,
                    decode_token_ms=step_ms, decode_total_ms=step_ms * steps,
                    prefill_throughput_requests_per_s=batch / (prefill_ms / 1e3),
                    decode_throughput_tokens_per_s=batch / (step_ms / 1e3))


TP_FLAG = re.compile(r"--tp\b(?!-)")


def serve_bench(base: ScenarioRequest, req: ServeBenchRequest) -> ServeBench:
    """The TGI-shaped serving report for ``base``'s model on ``shards`` GPUs of its device's kind."""
    gpu = resolve_device(base.device).gpu
    notes: set[str] = set()
    out = []
    name = ""
    # the model's position table bounds prompt + generated tokens, as estimate checks it
    check_positions(resolve_model(base.model)[1], SimpleNamespace(phase="generate", seq=req.seq,
                                                                  gen_tokens=req.decode_len))
    for s in req.shards:
        dev = gpus_device(gpu, s)
        plan = {"tp": s, "tp_scope": "full"} if s > 1 else {"tp": 1, "dp": 1}
        try:
            sc = resolve_scenario(base.model_copy(update={"device": dev, **plan}), "prefill")
        except AisimError as e:     # the shard count is the tensor parallel degree: name the flag the user gave
            msg = str(e)
            if "tensor parallel" not in msg and not TP_FLAG.search(msg):
                raise
            raise AisimError(f"--shards {s}: {TP_FLAG.sub('--shards', msg)}") from None
        name = sc.model
        notes.update(sc.assumptions)
        out.append(ServeShard(shards=s, device=dev.name, rows=[_row(sc, b, req) for b in req.batches]))
    rt = sc.runtime
    if rt.request_loop is not None:
        notes.add(f"runtime {rt.name}: the server's per-step work is modelled from counts in its source (per "
                  f"request: {rt.request_loop.launches} kernels, {rt.request_loop.syncs} host syncs, "
                  f"{rt.request_loop.vocab_passes} vocabulary passes; {rt.per_step_overhead_s * 1e3:g} ms per gRPC "
                  "step); the CPU time of tokenizing and detokenizing is not; the estimate traces the transformers "
                  "implementation of the model")
    else:
        notes.add(f"runtime {rt.name}: serve-bench prices its steps without a server's per-request loop (gRPC, "
                  "token choosers; --runtime tgi-2023 models TGI 0.x's)" + (
                      "; for its scheduler under a request load use `aisim serve`" if rt.serving is not None else ""))
    return ServeBench(model=name, device=str(base.device), seq=req.seq, decode_len=req.decode_len,
                      dtype=sc.dtype, quant=base.quant, runtime=rt.name,
                      max_batch_total_tokens=req.max_batch_total_tokens, shards=out, assumptions=sorted(notes))
