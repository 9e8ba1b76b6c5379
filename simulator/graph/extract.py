"""Workload drivers: run the meta model for a phase under the tracer and scale one traced layer to all layers.

Each workload is traced twice, with every layer stack cut to k1 = 2 and k2 = 3 layers; an op signature seen
c1 and c2 times occurs c1 + (L - k1) * (c2 - c1) times in the full model, and peak memory and parameter counts
extrapolate the same way (exact when the layers are identical, as in every model shipped). Two and three, not
one and two: the first layer is special for liveness (the embedding output stays referenced by the model's
forward while layer 0 runs, so with one layer it is also the residual), which would make a 1-to-2 difference
count a tensor per layer that is really live once. A 70B model traces in about a second this way. Graphs are
cached in memory and on disk as JSON (aisim.graph.cache: keyed on the config, workload, plan, the torch and
transformers versions and the graph-building source code).
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

from ..errors import AisimError
from ..workload import ParallelPlan, Workload
from .ops import Graph, Op, optimizer_op

TRACED_LAYERS = (2, 3)
TRANSCRIPT_FIELDS = {"audio_s", "beam", "transcript_tokens", "windows"}
WHISPER_WINDOW_FRAMES = 3000  # 30 s of audio at 100 mel frames per second (whisper's fixed input window)


def trace_workload(config: dict, workload: Workload, plan: ParallelPlan, *, use_cache: bool = True) -> Graph:
    """The per-GPU operator graph of one workload step (for PP: the heaviest stage)."""
    from . import cache

    traced = workload.model_dump(exclude=TRANSCRIPT_FIELDS)  # the recording's fields do not shape a step's graph
    inputs = cache.key_inputs(config, traced, plan.model_dump())
    key = cache.cache_key(inputs)
    if use_cache and key in _MEMORY:
        return _MEMORY[key]
    graph = cache.load(key, inputs) if use_cache else None
    if graph is None:
        graph = _trace_checked(config, workload, plan)
        if use_cache:
            cache.store(key, inputs, graph)
    _MEMORY[key] = graph
    if len(_MEMORY) > MEMORY_ENTRIES:
        _MEMORY.pop(next(iter(_MEMORY)))
    return graph


_MEMORY: dict[str, Graph] = {}
MEMORY_ENTRIES = 2048


def _trace_checked(config: dict, workload: Workload, plan: ParallelPlan) -> Graph:
    try:
        return _trace_scaled(config, workload, plan)
    except AisimError:
        raise
    except Exception as exc:  # the model's own code refused the workload: say so, without a traceback
        name = config.get("_name_or_path") or config.get("model_type")
        raise AisimError(f"{name}: tracing the {workload.phase} workload failed in the model's code "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); this "
                         f"model/workload/dtype combination is not supported (try another --workload or "
                         f"--dtype)") from None


def _traced_layers(config: dict, layers: int) -> tuple[int, int]:
    """The two depths traced: TRACED_LAYERS after the leading dense layers of a MoE model (DeepSeek's
    first_k_dense_replace), the second one period of ``layer_types`` deeper (gpt-oss alternates sliding and full
    attention: the increment is then the mean of one layer of each), so the increment is a typical layer."""
    lead = int(config.get("first_k_dense_replace") or 0)
    types = config.get("layer_types") or []
    period = next((p for p in range(1, len(types) + 1)
                   if all(t == types[i % p] for i, t in enumerate(types))), 1) if types else 1
    k1 = TRACED_LAYERS[0] + lead
    k2 = k1 + max(period, TRACED_LAYERS[1] - TRACED_LAYERS[0])
    return (k1, k2) if layers >= k2 else (layers, layers)


def _trace_scaled(config: dict, workload: Workload, plan: ParallelPlan) -> Graph:
    from .build import layer_count

    total_layers = layer_count(config)
    if plan.pp > total_layers:
        raise AisimError(f"pipeline parallel degree {plan.pp} exceeds the {total_layers} layers; choose --pp of at "
                         f"most {total_layers}")
    # vLLM splits the layers as evenly as it can (vllm/distributed/utils.py get_pp_indices: some stages one layer
    # more), Megatron by --decoder-first/last-pipeline-num-layers; a step is priced as pp stages of the largest
    # (scenario.uneven_stages_note)
    layers = -(-total_layers // plan.pp)
    if plan.dp > 1 and workload.batch % plan.dp:
        raise AisimError(f"data parallel degree {plan.dp} does not divide batch {workload.batch}; "
                         f"choose --dp among the divisors of {workload.batch}")
    k1, k2 = _traced_layers(config, layers)
    low = _trace_once(config, workload, plan, k1)
    high = _trace_once(config, workload, plan, k2) if k2 != k1 else low
    per_layer = (lambda a, b: (b - a) / (k2 - k1)) if k2 != k1 else (lambda a, b: 0.0)
    extra = layers - k1

    c1 = Counter(op.signature for op in low["ops"])
    c2 = Counter(op.signature for op in high["ops"])
    repeats = []
    for op in low["ops"]:
        s = op.signature
        full = c1[s] + extra * per_layer(c1[s], c2[s])
        repeats.append(max(full, 0.0) / c1[s])
    for op in high["ops"]:  # ops that only appear with 2+ layers (between layers): scaled the same way
        s = op.signature
        if s not in c1:
            repeats.append(max(extra * per_layer(0, c2[s]), 0.0) / c2[s])
            low["ops"].append(op)

    def scale(name: str) -> float:
        return low[name] + extra * per_layer(low[name], high[name])

    param_count = int(round(scale("param_count")))
    peak = max(scale("peak_bytes"), low["peak_bytes"])
    if workload.phase in ("forward-backward", "train"):
        # the forward's and the backward's peaks grow at different rates with depth (under autocast the forward
        # holds every layer's weight cast until it ends; the backward, the gradients): each is extrapolated on its
        # own, so the deeper model's peak may sit in the other phase than the traced ones'
        peak = max(peak, scale("peak_forward_bytes"), scale("peak_backward_bytes"))
    if workload.phase == "train":
        low["ops"].append(_optimizer_op(workload, param_count, int(round(scale("n_param_tensors")))))
        repeats.append(1.0)
    return Graph(ops=low["ops"], repeats=repeats, param_count=param_count,
                 param_bytes=scale("param_bytes"), peak_activation_bytes=peak,
                 persistent_bytes=max(scale("persistent_bytes"), 0.0), layers=layers, traced_layers=(k1, k2),
                 meta={"attn_implementation": low["attn"], "model_class": low["model_class"],
                       "vocab_size": config.get("vocab_size"),
                       "n_param_tensors": int(round(scale("n_param_tensors"))),
                       "linear_weights": int(round(scale("linear_weights"))),
                       "layer_params": int(round(per_layer(low["param_count"], high["param_count"]))),
                       "forward_end_bytes": max(scale("saved_bytes"), 0.0),
                       "peak_forward_bytes": max(scale("peak_forward_bytes"), 0.0),
                       "peak_backward_bytes": max(scale("peak_backward_bytes"), 0.0),
                       "saved_per_layer_bytes": _saved_per_layer(config, workload, plan, (k1, k2), low, high)})


def _saved_per_layer(config: dict, workload: Workload, plan: ParallelPlan, depths: tuple[int, int], low: dict,
                     high: dict) -> float:
    """What one layer's forward keeps for its backward (the growth of the forward end's live bytes per layer):
    the activations each further micro-batch in flight holds. A stage too short to trace at two depths is traced
    at the usual two for this alone."""
    k1, k2 = depths
    if workload.phase not in ("forward-backward", "train"):
        return 0.0
    if k1 == k2:
        k1, k2 = _traced_layers(config, 10**6)
        low, high = (_trace_once(config, workload, plan, k) for k in (k1, k2))
    return max((high["saved_bytes"] - low["saved_bytes"]) / (k2 - k1), 0.0)


def _trace_once(config: dict, workload: Workload, plan: ParallelPlan, layers: int) -> dict:
    import torch

    from .build import build_meta_model
    from .sharding import is_linear, shard_experts, shard_model
    from .tracer import Tracer, tracing

    weights_dtype = "fp32" if workload.autocast else workload.dtype  # mixed precision: fp32 master weights
    model, attn = build_meta_model(config, weights_dtype, layers, workload.attn_impl)
    tracer = Tracer()
    training = workload.phase in ("forward-backward", "train")
    shard_model(model, plan.tp, plan.tp_scope, tracer, plan.kv_replicas, plan.moe_reduce_once,
                gather_logits=not training)
    shard_experts(model, plan.tp, plan.ep, tracer)
    params = list(model.parameters())
    batch = workload.batch // plan.dp
    driver = _DRIVERS[workload.phase]
    model.eval()  # dropout off in every phase, as the validation suite measures (docs/model.md)
    if training:
        _training_options(model, params, workload)
    with torch.set_grad_enabled(training), _transformers_quiet():
        kept = driver(model, config, workload, batch, tracer, tracing)
    # what stays allocated after the step is the cache: the step's logits are consumed by sampling (they count in the
    # step's peak, as activations), so a full-vocabulary prompt's logits are not reported as KV cache
    persistent = tracer.live_bytes - _logits_bytes(kept)
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if is_linear(m) and not n.endswith("lm_head"))
    forward = [op for op in tracer.ops if op.phase == "forward"]
    saved = forward[-1].attrs.get("live_bytes", 0.0) if forward and training else 0.0  # kept for backward
    peaks = {phase: max((op.attrs.get("live_bytes", 0.0) for op in tracer.ops if op.phase == phase), default=0.0)
             for phase in ("forward", "backward")}
    result = {"ops": tracer.ops, "peak_bytes": tracer.peak_bytes, "persistent_bytes": persistent,
              "saved_bytes": saved, "peak_forward_bytes": peaks["forward"], "peak_backward_bytes": peaks["backward"],
              "linear_weights": linear,
              "param_count": sum(p.numel() for p in params),
              "param_bytes": float(sum(p.numel() * p.element_size() for p in params)),
              "n_param_tensors": len(params), "attn": attn, "model_class": type(model).__name__}
    del kept
    return result


@contextmanager
def _transformers_quiet():
    """transformers' own warnings while it runs on the meta device (its loss_type fallback, ...) are not the
    user's: errors only, restored after."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _ids(batch: int, seq: int):
    import torch

    return torch.zeros(batch, seq, dtype=torch.long, device="meta")


def _accepts(model, name: str) -> bool:
    import inspect

    return name in inspect.signature(model.forward).parameters


def _forward(model, config, w: Workload, batch, tracer, tracing):
    ids = _ids(batch, w.seq)
    kwargs = {"use_cache": False}
    if w.with_loss:
        kwargs["labels"] = ids
    with tracing(model, tracer):
        return model(input_ids=ids, **kwargs)


def _logits_bytes(kept) -> float:
    """Bytes of the logits a driver's output holds: a model output's, or the first item of a tuple (the decode
    driver's (output, cache); _decoder_step's (logits, cache, states))."""
    out = kept[0] if isinstance(kept, tuple) and kept else kept
    logits = out if hasattr(out, "element_size") else getattr(out, "logits", None)
    return float(logits.numel() * logits.element_size()) if hasattr(logits, "element_size") else 0.0


def _prefill(model, config, w: Workload, batch, tracer, tracing):
    """Generate's first step: builds the KV cache, computes logits for the last position only."""
    if config.get("is_encoder_decoder"):
        return _decoder_step(model, config, batch, w.seq, 0, tracer, tracing)
    ids = _ids(batch, w.seq)
    kwargs = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") and not w.logits_all else {}
    with tracing(model, tracer):
        return model(input_ids=ids, use_cache=True, **kwargs)


def _decode(model, config, w: Workload, batch, tracer, tracing):
    """One KV-cache step at context ``seq``: the cache holds seq - 1 tokens (built untraced), one new token."""
    import torch

    if config.get("is_encoder_decoder"):
        if w.step_tokens > w.seq:
            raise AisimError(f"step_tokens {w.step_tokens} exceeds the context {w.seq}")
        return _decoder_step(model, config, batch, w.step_tokens, w.seq - w.step_tokens, tracer, tracing,
                             w.logits_all)
    if w.step_tokens != 1:
        raise AisimError("decode steps of several tokens per sequence are supported for encoder-decoder models only")
    kwargs = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    from .tracer import Tracer

    # the cache is built untraced (item() needs the modes; TP hooks must not record)
    with tracer.suppressed(), torch.no_grad(), tracing(None, Tracer()):
        past = model(input_ids=_ids(batch, max(w.seq - 1, 1)), use_cache=True, **kwargs).past_key_values
        _compact_cache(past)
    for t in _tensors_in(past):
        tracer.track(t)
    with tracing(model, tracer):
        out = model(input_ids=_ids(batch, 1), past_key_values=past, use_cache=True, **kwargs)
    return out, past


def _forward_backward(model, config, w: Workload, batch, tracer, tracing):
    """``model(ids, labels=ids).loss.backward()``; only the loss is kept (a training loop drops the output, so the
    logits live only as autograd saved them). ``w.autocast``: the forward under emulated torch.autocast."""
    import contextlib

    import torch

    from .autocast import Autocast

    from .tracer import _Functions

    ids = _ids(batch, w.seq)
    low = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}.get(w.dtype, "float32"))
    autocast = Autocast(low)
    # a recomputed layer runs in the autograd engine's thread, where the function modes are not active: the
    # checkpoint's recompute context enters them again (fused attention, and autocast as checkpoint restores it)
    model._aisim_recompute_modes = [lambda: _Functions(tracer)] + (
        [lambda: Autocast(low).without_cache()] if w.autocast else [])
    with tracing(model, tracer), (autocast if w.autocast else contextlib.nullcontext()):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        autocast.clear(caching=False)   # leaving the autocast block drops the weight-cast cache
        tracer.phase = "backward"
        loss.backward()
    return None


def _training_options(model, params, w: Workload) -> None:
    """Activation checkpointing (HF's, non-reentrant, every decoder layer: the layers alone are put in training
    mode so that checkpointing applies while dropout stays off) and the release of full gradients (ZeRO-2/3,
    FSDP: a post-accumulate-grad hook drops each gradient, as the reduce-scatter frees it).
    Selective recompute (Megatron: the attention core) saves nothing with a fused attention kernel, whose score
    matrix is never stored (Korthikanti et al. 2022, sec. 4.2): it traces as no recompute."""
    if w.recompute == "full" and getattr(model, "supports_gradient_checkpointing", False):
        import contextlib
        import functools

        import torch.utils.checkpoint as ckpt

        @contextlib.contextmanager
        def recompute_modes():
            with contextlib.ExitStack() as stack:
                for make in getattr(model, "_aisim_recompute_modes", ()):
                    stack.enter_context(make())
                yield

        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        func = functools.partial(ckpt.checkpoint, use_reentrant=False,
                                 context_fn=lambda: (contextlib.nullcontext(), recompute_modes()))
        from transformers.modeling_layers import GradientCheckpointingLayer

        for module in model.modules():
            if getattr(module, "gradient_checkpointing", False):
                module._gradient_checkpointing_func = func
                # only the checkpointed layers train (a container in training mode would run e.g. OPT's LayerDrop,
                # whose meta-device coin flip skips every layer); the layers' own dropout then traces, as it runs
                module.training = isinstance(module, GradientCheckpointingLayer)
    if w.grad_release:
        def drop(p):
            p.grad = None
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(drop)


def _encode(model, config, w: Workload, batch, tracer, tracing):
    """The encoder on one 30 s window; with ``encode_cross_kv`` also every decoder layer's cross-attention K and
    V projections of its output (computed once per window and reused by every decoder step)."""
    import torch

    encoder = model.get_encoder()
    mels = config.get("num_mel_bins", 80)
    dtype = next(model.parameters()).dtype
    features = torch.zeros(batch, mels, WHISPER_WINDOW_FRAMES, dtype=dtype, device="meta")
    with tracing(model if w.encode_cross_kv else encoder, tracer):
        out = encoder(input_features=features)
        if not w.encode_cross_kv:
            return out
        states = out.last_hidden_state
        cross = [(layer.encoder_attn.k_proj(states), layer.encoder_attn.v_proj(states))
                 for layer in model.get_decoder().layers]
    return out, cross


def _encoder_states(model, config, batch: int):
    """The encoder output a decoder attends to: batch x frames x d_model (1500 frames for whisper's window)."""
    import torch

    frames = config.get("max_source_positions") or WHISPER_WINDOW_FRAMES // 2
    dtype = next(model.parameters()).dtype
    return torch.zeros(batch, frames, config["d_model"], dtype=dtype, device="meta")


def _decoder_step(model, config, batch: int, new_tokens: int, past: int, tracer, tracing, logits_all: bool = False):
    """One decoder call of an encoder-decoder model: ``new_tokens`` per sequence after ``past`` cached ones, with
    the cross-attention K/V already cached (they belong to the encode phase) and logits for the last position
    (every new position with ``logits_all``).
    The cache is built untraced; its self-attention part is cropped to ``past`` tokens."""
    import torch

    from .tracer import Tracer

    states = _encoder_states(model, config, batch)
    with tracer.suppressed(), torch.no_grad(), tracing(None, Tracer()):
        cache = model(encoder_outputs=(states,), decoder_input_ids=_ids(batch, max(past, 1)),
                      use_cache=True).past_key_values
        if past == 0:  # transformers 5.17: crop(-n) removes n tokens (crop(0) does nothing)
            cache.self_attention_cache.crop(-1)
    for t in _tensors_in(cache):
        tracer.track(t)
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    with tracing(model, tracer):
        out = decoder(input_ids=_ids(batch, new_tokens), encoder_hidden_states=states, past_key_values=cache,
                      use_cache=True)
        hidden = out.last_hidden_state
        logits = head(hidden if logits_all else hidden[:, -1:])
    return logits, cache, states


_DRIVERS = {"forward": _forward, "prefill": _prefill, "decode": _decode, "forward-backward": _forward_backward,
            "train": _forward_backward, "encode": _encode}


def _compact_cache(past) -> None:
    """Give every cached key/value its own storage. After a prefill, a sliding-window layer's cache is a slice of
    the whole prompt's keys (transformers 5.17 cache_utils.py:255, DynamicSlidingWindowLayer.update keeps
    ``full_key_states[:, :, -sliding_window + 1:, :]``), a view that pins the prompt-length storage until the first
    decode step replaces it; a steady decode step holds only the window."""
    import torch

    for layer in getattr(past, "layers", None) or []:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > t.numel() * t.element_size():
                setattr(layer, name, t.clone())


def _tensors_in(obj, depth: int = 0) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 4 or obj is None or isinstance(obj, (int, float, str, bool)):
        return []
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return []
    found = []
    for item in items:
        found.extend(_tensors_in(item, depth + 1))
    return found


def _optimizer_op(w: Workload, param_count: int, n_tensors: int) -> Op:
    """The optimizer step as one op over all parameters (costed by the optimizer formulas); mixed precision steps
    the fp32 master weights."""
    return optimizer_op(w.optimizer, param_count, "fp32" if w.dtype == "tf32" or w.autocast else w.dtype, n_tensors)