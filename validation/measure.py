"""Measure one case on the local device: build the HF model from its config, run a workload, time it.

Model: ``AutoModelForCausalLM.from_config`` built directly on the device (random weights, eval mode so
dropout is off), attention through SDPA where the architecture has it (BLOOM falls back to eager).

Workloads (one "step" each; tokens per step in brackets):

- forward:  ``model(ids, use_cache=False)`` under inference_mode, full logits  [batch x seq]
- prefill:  ``model(ids, use_cache=True, logits_to_keep=1)``: generate's first step, the DynamicCache built,
            logits of the last position only  [batch x seq]
- decode:   one new token per row attending over ``seq`` tokens: the cache holds seq - 1 tokens (a real
            chunked prefill, or random values above ``real_prefill_max_tokens``), and after every step
            ``cache.crop(-1)`` drops the token the step appended and the cache is made contiguous again
            (untimed; the energy of those copies, measured alone, is subtracted)  [batch]
- forward-backward: ``model(ids, labels=ids).loss.backward()``, grads set to None after each step  [batch x seq]
- train:    forward-backward plus ``torch.optim.AdamW.step()`` (foreach default)  [batch x seq]

Encoder-decoder models (Whisper; the class its config names):

- encode:   the encoder on one 30 s window of random log-mel features (batch x mels x 3000)  [batch]
- decode:   a decoder call of ``step_tokens`` new tokens per row after ``seq - step_tokens`` cached ones, attending
            to random encoder states (batch x 1500 x d_model) whose cross-attention K/V are cached (computed
            untimed, as in aisim's encode/decode split), logits of the last position; after every step the
            self-attention cache is cropped back (untimed)  [batch x step_tokens]

Timing: ``warmup`` untimed steps; the last one, synchronised, sizes the timed window: n trials with
n >= min_trials lasting >= max(min_time_s, energy_min_s). Trials are timed with CUDA events and run back to
back (tensor parallel: a barrier and a synchronize before each trial, the runtime of a trial is the max over
ranks). Energy is the NVML total-energy counter read before and after that window (summed over ranks); peak
memory is torch.cuda.max_memory_allocated over the window (max over ranks). The energy window opens and closes on a step of the counter (gpu.wait_energy_tick).
GB = 1e9 bytes.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from . import gpu
from ..units import TORCH_DTYPE_NAMES
from .suite import Case, MeasureSettings

MS_PER_S = 1e3
AFTER_WORK_NEGLIGIBLE = 0.02   # untimed work below this fraction of the window is not subtracted from energy


@dataclass
class BuiltModel:
    """A model on its device, with what a result records about it."""
    model: object
    config: object
    name: str
    dtype: str
    device: object
    attn_implementation: str
    build_s: float
    rank: int = 0
    world: int = 1
    tp_scope: str = "all"
    nvml: object = None

    @property
    def distributed(self) -> bool:
        return self.world > 1


@dataclass
class Steps:
    """A prepared workload: ``step`` is timed, ``after`` runs between trials (untimed), ``cleanup`` once."""
    step: Callable[[], None]
    after: Callable[[], None] = lambda: None
    cleanup: Callable[[], None] = lambda: None
    info: dict = field(default_factory=dict)
    check: Callable[[], None] | None = None   # run once after the first warm-up step
    after_work: Callable[[], None] | None = None  # the GPU work of ``after`` alone, to subtract its energy


def hf_config(model: str):
    """A transformers config for a shipped model name or a config.json path (aisim.catalog.resolve_model)."""
    from transformers import AutoConfig

    from aisim.catalog import resolve_model

    _, config = resolve_model(model)
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = config.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"model {model!r}: its config has no model_type, so transformers cannot build it")
    return AutoConfig.for_model(model_type, **config)


def build_model(model: str, dtype: str, device, *, seed: int = 0, rank: int = 0, world: int = 1,
                tp_scope: str = "all", ep: int = 1) -> BuiltModel:
    """Build ``model`` with random weights directly on ``device``; sharded for TP rank ``rank`` if world > 1."""
    import torch
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    config = hf_config(model)
    torch_dtype = getattr(torch, TORCH_DTYPE_NAMES[dtype])
    torch.manual_seed(seed)
    built = None
    cls = AutoModelForCausalLM
    if getattr(config, "is_encoder_decoder", False):
        from aisim.catalog import resolve_model
        from aisim.graph.build import model_class

        cls = model_class(resolve_model(model)[1])
    for impl in ("sdpa", "eager"):
        try:
            with torch.device(device):
                make = cls.from_config if hasattr(cls, "from_config") else cls._from_config
                built = make(config, dtype=torch_dtype, attn_implementation=impl)
            break
        except (ValueError, ImportError) as exc:
            if impl == "eager" or "attention" not in str(exc).lower():
                raise
    built.eval()
    if world > 1:
        from .tp import shard_model

        shard_model(built, rank, world, tp_scope, experts_by_index=ep > 1)
    _synchronize(device)
    handle = gpu.nvml_handle(device.index) if device.type == "cuda" else None
    return BuiltModel(built, built.config, model, dtype, device, built.config._attn_implementation,
                      time.perf_counter() - start, rank, world, tp_scope, handle)


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _random_ids(bm: BuiltModel, settings: MeasureSettings, shape, generator):
    import torch

    high = max(2, min(int(bm.config.vocab_size), settings.max_token_id))
    return torch.randint(0, high, shape, generator=generator, device=bm.device)


def _generator(bm: BuiltModel, settings: MeasureSettings, offset: int = 0):
    import torch

    g = torch.Generator(device=bm.device)
    g.manual_seed(settings.seed + offset)
    return g


def _inference(model, **kwargs) -> Callable[[], None]:
    import torch

    def step() -> None:
        with torch.inference_mode():
            model(**kwargs)
    return step


def _fill_kv_cache(bm: BuiltModel, case: Case, settings: MeasureSettings, g):
    """A DynamicCache holding seq - 1 tokens per row: a real chunked prefill, or random keys/values for big ones."""
    import torch
    from transformers import DynamicCache

    context = case.seq - 1
    cache = DynamicCache(config=bm.config)
    real = case.batch * context <= settings.real_prefill_max_tokens
    chunk = max(1, settings.prefill_chunk_tokens // case.batch) if real else 1
    with torch.inference_mode():
        for start in range(0, context if real else 1, chunk):
            ids = _random_ids(bm, settings, (case.batch, min(chunk, context - start)), g)
            bm.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        if not real:  # grow the 1-token cache to `context` tokens of random values (same shapes as a prefill)
            for layer in cache.layers:
                b, h, _, d = layer.keys.shape
                layer.keys = torch.randn((b, h, context, d), dtype=layer.keys.dtype, device=layer.keys.device)
                layer.values = torch.randn((b, h, context, d), dtype=layer.values.dtype, device=layer.values.device)
    if cache.get_seq_length() != context:
        raise RuntimeError(f"KV cache holds {cache.get_seq_length()} tokens, expected {context}")
    return cache, ("prefill" if real else "random")


def _decode(bm: BuiltModel, case: Case, settings: MeasureSettings, g) -> Steps:
    cache, fill = _fill_kv_cache(bm, case, settings, g)
    new = _random_ids(bm, settings, (case.batch, 1), g)
    step = _inference(bm.model, input_ids=new, past_key_values=cache, use_cache=True)
    context = case.seq - 1

    def after() -> None:
        # transformers 5.17: a negative value removes that many tokens. The cropped tensors are views with a
        # gap per (batch, head) row; HF's next torch.cat would read them through a slow strided path (4x on
        # H100 for a 64 x 1024 cache), so they are made contiguous again, as a real generation step leaves them.
        cache.crop(-1)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()

    def same_copies() -> None:   # the copies of after(), with no change to the cache (energy subtraction)
        for layer in cache.layers:
            layer.keys.clone(), layer.values.clone()

    def check() -> None:
        if cache.get_seq_length() != context:
            raise RuntimeError(f"cache.crop left {cache.get_seq_length()} tokens, expected {context}")

    return Steps(step, after, cleanup=lambda: cache.layers.clear(), info={"kv_fill": fill}, check=check,
                 after_work=same_copies)


def _backward(bm: BuiltModel, case: Case, settings: MeasureSettings, g) -> Steps:
    import torch

    for p in bm.model.parameters():
        p.requires_grad_(True)
    ids = _random_ids(bm, settings, (case.batch, case.seq), g)
    optimizer = torch.optim.AdamW(bm.model.parameters(), lr=1e-6) if case.workload == "train" else None

    def step() -> None:
        bm.model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        if optimizer is not None:
            optimizer.step()

    def after() -> None:
        bm.model.zero_grad(set_to_none=True)

    def cleanup() -> None:
        after()
        if optimizer is not None:
            optimizer.state.clear()

    info = {"loss_included": True, "optimizer": "adamw (foreach default)" if optimizer else None}
    return Steps(step, after, cleanup, info)


def check_positions(bm: BuiltModel, case: Case) -> None:
    """Refuse a sequence longer than the model's position table: learned positions (OPT, GPT-2) would index
    out of range, a device-side assert that leaves the CUDA context unusable for the rest of the run."""
    limit = getattr(bm.config, "max_position_embeddings", None)
    if isinstance(limit, int) and case.seq > limit:
        raise ValueError(f"{case.model}: seq {case.seq} is longer than max_position_embeddings {limit}")


def _encoder_states(bm: BuiltModel, batch: int, g):
    import torch

    frames = int(getattr(bm.config, "max_source_positions", 1500))
    return torch.randn((batch, frames, bm.config.d_model), generator=g, device=bm.device,
                       dtype=next(bm.model.parameters()).dtype)


def _encode(bm: BuiltModel, case: Case, g) -> Steps:
    import torch

    mels = int(getattr(bm.config, "num_mel_bins", 80))
    features = torch.randn((case.batch, mels, 3000), generator=g, device=bm.device,
                           dtype=next(bm.model.parameters()).dtype)
    return Steps(_inference(bm.model.get_encoder(), input_features=features))


def _decoder_step(bm: BuiltModel, case: Case, settings: MeasureSettings, g) -> Steps:
    import torch

    past = case.seq - case.step_tokens
    states = _encoder_states(bm, case.batch, g)
    with torch.inference_mode():
        ids = _random_ids(bm, settings, (case.batch, max(past, 1)), g)
        cache = bm.model(encoder_outputs=(states,), decoder_input_ids=ids, use_cache=True).past_key_values
        if past == 0:  # transformers 5.17: crop(-n) removes n tokens (crop(0) does nothing)
            cache.self_attention_cache.crop(-1)
    new = _random_ids(bm, settings, (case.batch, case.step_tokens), g)
    decoder, head = bm.model.get_decoder(), bm.model.get_output_embeddings()

    def step() -> None:
        with torch.inference_mode():
            hidden = decoder(input_ids=new, encoder_hidden_states=states, past_key_values=cache,
                             use_cache=True).last_hidden_state
            head(hidden[:, -1:])

    def after() -> None:
        cache.self_attention_cache.crop(-case.step_tokens)
        for layer in cache.self_attention_cache.layers:
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()

    def check() -> None:
        if cache.self_attention_cache.get_seq_length() != past:
            raise RuntimeError(f"cache.crop left {cache.self_attention_cache.get_seq_length()} tokens, expected {past}")

    def same_copies() -> None:   # the copies of after(), with no change to the cache (energy subtraction)
        for layer in cache.self_attention_cache.layers:
            layer.keys.clone(), layer.values.clone()

    return Steps(step, after, cleanup=lambda: cache.self_attention_cache.layers.clear(), check=check,
                 info={"kv_fill": "prefill", "cross_kv": "cached"}, after_work=same_copies)


def prepare(bm: BuiltModel, case: Case, settings: MeasureSettings) -> Steps:
    """Inputs and step functions for ``case`` on the built model."""
    g = _generator(bm, settings)
    if getattr(bm.config, "is_encoder_decoder", False):
        if case.workload == "encode":
            return _encode(bm, case, g)
        if case.workload == "decode":
            return _decoder_step(bm, case, settings, g)
        raise ValueError(f"{case.model}: encoder-decoder models are measured in encode and decode only")
    if case.workload == "encode":
        raise ValueError(f"{case.model} has no encoder: encode needs an encoder-decoder model")
    check_positions(bm, case)
    if case.workload == "decode":
        return _decode(bm, case, settings, g)
    if case.training:
        return _backward(bm, case, settings, g)
    ids = _random_ids(bm, settings, (case.batch, case.seq), g)
    if case.workload == "prefill":
        return Steps(_inference(bm.model, input_ids=ids, use_cache=True, logits_to_keep=1))
    return Steps(_inference(bm.model, input_ids=ids, use_cache=False))


@dataclass
class _Window:
    times_ms: list[float]
    wall_s: float
    energy_j: float | None
    energy_window_s: float | None     # between the two counter steps that open and close the window
    energy_after_work_j: float | None  # energy of the untimed work between trials (subtracted per step)
    peak_gb: float | None
    reserved_gb: float | None
    nvml_gb: float | None
    sm_clock_mhz: float | None


def _trial_count(bm: BuiltModel, steps: Steps, settings: MeasureSettings, energy: bool) -> int:
    """Run the warm-up; size the window from the last (synchronised) warm-up step."""
    for i in range(settings.warmup):
        if i == settings.warmup - 1:
            _synchronize(bm.device)
            t0 = time.perf_counter()
        steps.step()
        _synchronize(bm.device)
        steps.after()
        if i == 0 and steps.check is not None:
            steps.check()
    step_s = max(time.perf_counter() - t0, 1e-6)
    window_s = max(settings.min_time_s, settings.energy_min_s if energy else 0.0)
    n = min(settings.max_trials, max(settings.min_trials, math.ceil(window_s / step_s)))
    if bm.distributed:
        n = int(_reduce(bm, [n], "max")[0])
    return n


def _timed_window(bm: BuiltModel, steps: Steps, n: int) -> _Window:
    import torch

    cuda = bm.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(bm.device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    _synchronize(bm.device)
    tick0 = gpu.wait_energy_tick(bm.nvml)
    t0 = time.perf_counter()
    cpu_ms = []
    for i in range(n):
        if bm.distributed:
            _barrier(bm)
        if cuda:
            events[i][0].record()
            steps.step()
            events[i][1].record()
        else:
            c0 = time.perf_counter()
            steps.step()
            cpu_ms.append((time.perf_counter() - c0) * MS_PER_S)
        steps.after()
    _synchronize(bm.device)
    wall = time.perf_counter() - t0
    tick1 = gpu.wait_energy_tick(bm.nvml)
    times = [s.elapsed_time(e) for s, e in events] if cuda else cpu_ms
    energy, energy_s, overhead = None, None, None
    if tick0 is not None and tick1 is not None:
        energy, energy_s = (tick1[1] - tick0[1]) / gpu.MJ_PER_J, tick1[0] - tick0[0]
        overhead = _after_work_energy(bm, steps, n, wall)
    return _Window(times, wall, energy, energy_s, overhead,
                   torch.cuda.max_memory_allocated(bm.device) / gpu.GB if cuda else None,
                   torch.cuda.max_memory_reserved(bm.device) / gpu.GB if cuda else None,
                   gpu.used_memory_gb(bm.nvml), gpu.sm_clock_mhz(bm.nvml))


def _after_work_energy(bm: BuiltModel, steps: Steps, n: int, window_s: float) -> float | None:
    """Energy (J) of ``n`` runs of the untimed work between trials, measured alone; None where there is no
    such work or it is negligible (under AFTER_WORK_NEGLIGIBLE of the window), so no noise is subtracted."""
    if steps.after_work is None:
        return None
    _synchronize(bm.device)
    tick0 = gpu.wait_energy_tick(bm.nvml)
    t0 = time.perf_counter()
    for _ in range(n):
        steps.after_work()
    _synchronize(bm.device)
    busy_s = time.perf_counter() - t0
    tick1 = gpu.wait_energy_tick(bm.nvml)
    if busy_s < AFTER_WORK_NEGLIGIBLE * window_s:
        return None
    return (tick1[1] - tick0[1]) / gpu.MJ_PER_J


def _barrier(bm: BuiltModel) -> None:
    import torch.distributed as dist

    _synchronize(bm.device)
    dist.barrier()
    _synchronize(bm.device)


def _reduce(bm: BuiltModel, values: list[float], op: str) -> list[float]:
    """All-reduce a list of floats over the TP ranks (op 'max', 'sum' or 'min')."""
    import torch
    import torch.distributed as dist

    device = bm.device if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


def _combine_ranks(bm: BuiltModel, w: _Window) -> _Window:
    """Per trial the slowest rank; memory the largest rank; energy the sum over ranks (None if any lacks it)."""
    if not bm.distributed:
        return w
    times = _reduce(bm, w.times_ms, "max")
    missing = -1.0
    mx = _reduce(bm, [v if v is not None else missing for v in (w.peak_gb, w.reserved_gb, w.nvml_gb)], "max")
    has_energy = _reduce(bm, [0.0 if w.energy_j is None else 1.0], "min")[0] > 0
    energy = _reduce(bm, [w.energy_j or 0.0], "sum")[0] if has_energy else None
    energy_s = _reduce(bm, [w.energy_window_s or 0.0], "max")[0] if has_energy else None
    after = _reduce(bm, [w.energy_after_work_j or 0.0], "sum")[0] if has_energy else None
    peak, reserved, nvml = (v if v != missing else None for v in mx)
    return _Window(times, _reduce(bm, [w.wall_s], "max")[0], energy, energy_s, after or None, peak, reserved,
                   nvml, w.sm_clock_mhz)


def _summarise(case: Case, n_warmup: int, w: _Window, timer: str) -> dict:
    median = statistics.median(w.times_ms)
    net_j = w.energy_j - (w.energy_after_work_j or 0.0) if w.energy_j is not None else None
    energy_step = net_j / len(w.times_ms) if net_j is not None else None
    return {
        "runtime_ms_median": median,
        "runtime_ms_mean": statistics.fmean(w.times_ms),
        "runtime_ms_std": statistics.stdev(w.times_ms) if len(w.times_ms) > 1 else 0.0,
        "runtime_ms_min": min(w.times_ms),
        "runtime_ms_max": max(w.times_ms),
        "trials": len(w.times_ms),
        "warmup": n_warmup,
        "timer": timer,
        "window_s": w.wall_s,
        "peak_memory_gb": w.peak_gb,
        "reserved_memory_gb": w.reserved_gb,
        "nvml_memory_gb": w.nvml_gb,
        "energy_available": w.energy_j is not None,
        "energy_j_per_step": energy_step,
        "energy_j_per_token": energy_step / case.tokens if energy_step is not None else None,
        "energy_window_s": w.energy_window_s,
        "energy_after_work_j": w.energy_after_work_j,
        "avg_power_w": w.energy_j / w.energy_window_s if w.energy_j is not None and w.energy_window_s else None,
        "sm_clock_mhz": w.sm_clock_mhz,
        "tokens": case.tokens,
        "throughput_tokens_per_s": case.tokens / (median / MS_PER_S) if median > 0 else None,
    }


def measure_case(bm: BuiltModel, case: Case, settings: MeasureSettings) -> dict:
    """Measure ``case`` on the built model; every TP rank calls this together and gets the combined result.

    Raises what the workload raises (torch.OutOfMemoryError included); the caller records it and frees memory.
    """
    start = time.perf_counter()
    steps = prepare(bm, case, settings)
    try:
        energy = gpu.energy_mj(bm.nvml) is not None
        if bm.distributed:
            energy = _reduce(bm, [1.0 if energy else 0.0], "min")[0] > 0
        n = _trial_count(bm, steps, settings, energy)
        window = _combine_ranks(bm, _timed_window(bm, steps, n))
    finally:
        steps.cleanup()
    result = _summarise(case, settings.warmup, window, "cuda-events" if bm.device.type == "cuda" else "perf_counter")
    result.update({
        "attn_implementation": bm.attn_implementation,
        "model_mode": "eval (dropout off)",
        "tp_impl": None if bm.world == 1 else "plain-sharded-allreduce-hooks",
        "build_s": bm.build_s,
        "case_s": time.perf_counter() - start,
        **steps.info,
    })
    return result


def free_memory(device=None) -> None:
    """Collect garbage and return cached blocks to the driver (after a case, an OOM, or a model)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
