"""Serving benchmark in the shape of text-generation-inference's `text-generation-benchmark` report.

For each shard count (tensor parallel degree, vocab-parallel LM head as TGI shards it) and batch size:
prefill latency of batch x seq tokens, decode latency per step (the mean of the first and last of the
decode_len - 1 steps, linear in context) and in total, prefill throughput in requests/s (batch / prefill latency,
as TGI defines it) and decode throughput in tokens/s (batch / step latency). A batch that does not fit (weights,
KV cache and activations over capacity, or batch x (seq + decode_len) over max_batch_total_tokens when given) is
reported as not fitting with the numbers, where TGI's report shows NaN.

The default ``--runtime tgi-2023`` adds TGI 0.x's own per-step work (its request loop, full-vocabulary prefill
logits, a gRPC call per step: hardware_specs/runtimes/tgi-2023.yaml). Known inaccuracies: the estimate traces the
transformers implementation of the model, not TGI's own modeling code; tokenizer CPU time is not modelled.
"""
from __future__ import annotations

from pydantic import BaseModel

from .api import estimate
from .catalog import resolve_device
from .errors import AisimError


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


def _device_for(device: str, shards: int) -> str:
    gpu = resolve_device(device).gpu.name
    return gpu if shards == 1 else f"{gpu}x{shards}"


def _row(model: str, device: str, shards: int, batch: int, seq: int, decode_len: int, common: dict,
         max_batch_total_tokens: int | None, notes: set[str]) -> ServeRow:
    plan = {"tp": shards, "tp_scope": "full"} if shards > 1 else {}
    prefill = estimate(model=model, device=device, workload="prefill", batch=batch, seq=seq, **plan, **common)
    steps = max(decode_len - 1, 1)
    first = estimate(model=model, device=device, workload="decode", batch=batch, seq=seq + 1, **plan, **common)
    last = estimate(model=model, device=device, workload="decode", batch=batch, seq=seq + steps, **plan, **common)
    notes.update(prefill.assumptions)
    memory = max(prefill.memory_gb, last.memory_gb)
    tokens = batch * (seq + decode_len)
    if max_batch_total_tokens is not None and tokens > max_batch_total_tokens:
        return ServeRow(batch=batch, fits=False, memory_gb=memory,
                        not_fit_reason=f"batch x (seq + decode) = {tokens} tokens > max_batch_total_tokens "
                                       f"{max_batch_total_tokens}")
    for e in (prefill, last):
        if not e.fits:
            return ServeRow(batch=batch, fits=False, memory_gb=memory, not_fit_reason=e.not_fit_reason)
    step_ms = (first.runtime_ms + last.runtime_ms) / 2
    return ServeRow(batch=batch, fits=True, memory_gb=memory, prefill_ms=prefill.runtime_ms,
                    decode_token_ms=step_ms, decode_total_ms=step_ms * steps,
                    prefill_throughput_requests_per_s=batch / (prefill.runtime_ms / 1e3),
                    decode_throughput_tokens_per_s=batch / (step_ms / 1e3))


def serve_bench(model: str, device: str, shards: list[int], batches: list[int], seq: int = 1024,
                decode_len: int = 8, dtype: str = "fp16", quant: str = "none", runtime: str = "tgi-2023",
                max_batch_total_tokens: int | None = None) -> ServeBench:
    """The TGI-shaped serving report for ``model`` on ``shards`` GPUs of ``device``'s kind."""
    if decode_len < 2:
        raise AisimError("--decode-len must be at least 2 (one token from prefill, then decode steps)")
    if max_batch_total_tokens is not None and max_batch_total_tokens < 1:
        raise AisimError("--max-batch-total-tokens must be a positive number of tokens (leave it out for no limit)")
    common = {"dtype": dtype, "quant": quant, "runtime": runtime}
    notes: set[str] = set()
    out = []
    for s in shards:
        dev = _device_for(device, s)
        out.append(ServeShard(shards=s, device=dev, rows=[
            _row(model, dev, s, b, seq, decode_len, common, max_batch_total_tokens, notes) for b in batches]))
    name = estimate(model=model, device=_device_for(device, 1), workload="prefill", batch=1, seq=seq,
                    **common).model
    from .specs import all_runtimes

    rt = all_runtimes().get(runtime)
    if rt is not None and rt.request_loop is not None:
        notes.add(f"runtime {runtime}: the server's per-step work is modelled from counts in its source (per "
                  f"request: {rt.request_loop.launches} kernels, {rt.request_loop.syncs} host syncs, "
                  f"{rt.request_loop.vocab_passes} vocabulary passes; {rt.per_step_overhead_s * 1e3:g} ms per gRPC "
                  "step); the CPU time of tokenizing and detokenizing is not; the estimate traces the transformers "
                  "implementation of the model")
    else:
        notes.add(f"runtime {runtime} has no serving loop: a server's per-step work (gRPC, token choosers) is not "
                  "modelled (--runtime tgi-2023 models TGI 0.x's)")
    return ServeBench(model=name, device=device, seq=seq, decode_len=decode_len, dtype=dtype, quant=quant,
                      runtime=runtime, max_batch_total_tokens=max_batch_total_tokens, shards=out,
                      assumptions=sorted(notes))
