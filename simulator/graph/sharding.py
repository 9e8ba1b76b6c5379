"""Megatron-style tensor parallelism applied to the meta model: column/row sharded linears and their collectives.

Column-parallel linears keep 1/tp of their output features, row-parallel ones 1/tp of their inputs; each
row-parallel output is all-reduced (forward), and each block input is all-reduced in backward (Megatron's f/g).
``scope='mlp'`` shards only the MLP projections (attention replicated), as TorchCAP's 8-GPU runs did;
'all' shards attention and MLP with the embeddings and LM head replicated (plain HF sharding, as the validation
suite measures); 'full' also makes the LM head vocab-parallel with an all-gather of the logits (Megatron, TGI).
"""
from __future__ import annotations

import torch

from ..errors import AisimError

from .tp_rules import HEAD_ATTRS, roles, row_role


def is_linear(module) -> bool:
    """nn.Linear, or transformers' Conv1D (GPT-2: a linear layer with its weight stored transposed)."""
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


KV_PROJECTIONS = frozenset({"k_proj", "v_proj"})
FUSED_QKV = frozenset({"qkv_proj", "query_key_value", "Wqkv", "c_attn"})


def shard_model(model, tp: int, scope: str, tracer, kv_replicas: int = 1, moe_reduce_once: bool = False,
                gather_logits: bool = True) -> int:
    """Shard the meta model in place for one rank; returns how many linears were sharded. ``kv_replicas`` > 1:
    tp exceeds the KV heads and each rank keeps one KV head (vLLM's QKVParallelLinear: k_proj and v_proj keep
    out_features x kv_replicas / tp, the attention its query heads / tp over one KV head). ``moe_reduce_once``: a
    shared expert's row-parallel output inside an MoE block is not all-reduced on its own; the block's routed
    output and it are summed and all-reduced once (shard_experts' all-reduce), as vLLM's Qwen2MoE and DeepSeek-V2
    blocks do (shared expert and FusedMoE built with reduce_results=False, one tensor_model_parallel_all_reduce).
    ``gather_logits`` False (training): a vocab-parallel head keeps its logits sharded and the loss runs on them,
    as Megatron's vocab-parallel cross entropy does (_vocab_parallel_loss); True: the logits are all-gathered."""
    if tp == 1:
        return 0
    column, row = roles(scope)
    sharded = 0
    blocks = set()
    moe_blocks = _moe_blocks(model)   # once: the backward all-reduce placement below uses them too
    in_moe = moe_blocks if moe_reduce_once else set()
    for name, module in list(model.named_modules()):
        if not is_linear(module):
            continue
        parent, _, leaf = name.rpartition(".")
        owner = parent.rpartition(".")[2]
        if kv_replicas > 1 and leaf in FUSED_QKV:
            raise AisimError(f"KV heads replicated over tp {tp} with a fused QKV projection ({name}) are not "
                             "modelled; choose --tp among the divisors of num_key_value_heads")
        if leaf in column or (leaf == "lm_head" and scope == "full"):
            keep = kv_replicas if leaf in KV_PROJECTIONS else 1
            _resize(module, out_features=_features(module, "out") * keep // tp)
            if leaf == "lm_head":
                module.register_forward_hook(_collective_hook(tracer, "all_gather", tp) if gather_logits
                                             else _vocab_parallel_loss(tracer, tp))
                if not gather_logits:
                    # HF's loss views the logits as (-1, vocab_size), read from the config or (OLMoE, Mixtral)
                    # the model's own attribute: this rank's slice of the vocabulary
                    for owner in (model.config, model):
                        if isinstance(getattr(owner, "vocab_size", None), int):
                            owner.vocab_size = _features(module, "out")
                    _hook_grad_allreduce(module, tracer, tp)   # the head's input gradient: partial sums over vocab
                _vocab_parallel_embedding(model, module, tp, tracer)
            else:
                blocks.add(parent)
            sharded += 1
        elif leaf in row or row_role(leaf, owner, scope):
            _resize(module, in_features=_features(module, "in") // tp)
            if _enclosing(name, in_moe) is None:
                module.register_forward_hook(_collective_hook(tracer, "all_reduce", tp))
            sharded += 1
    heads_sharded = scope in ("all", "full", "layers", "attention")
    for name, module in model.named_modules():
        # head counts the code reshapes with: on attention blocks, and on model roots that build per-head
        # tensors for all blocks (BLOOM's ALiBi slopes)
        if heads_sharded and (name in blocks or not any(is_linear(c) for c in module.children())):
            for attr in HEAD_ATTRS:
                if isinstance(getattr(module, attr, None), int) and not is_linear(module):
                    keep = kv_replicas if attr == "num_key_value_heads" else 1
                    setattr(module, attr, getattr(module, attr) * keep // tp)
            groups = getattr(module, "num_key_value_groups", None)   # query heads per KV head (repeat_kv)
            if kv_replicas > 1 and isinstance(groups, int) and not is_linear(module):
                module.num_key_value_groups = groups // kv_replicas
        if name in blocks:
            sinks = getattr(module, "sinks", None)       # per-head attention sinks (gpt-oss): this rank's heads
            if heads_sharded and isinstance(sinks, torch.nn.Parameter) and sinks.dim() == 1:
                module.sinks = torch.nn.Parameter(torch.empty(sinks.shape[0] // tp, device="meta", dtype=sinks.dtype))
    for name in _grad_allreduce_blocks(blocks, moe_blocks):
        _hook_grad_allreduce(model.get_submodule(name), tracer, tp)
    if heads_sharded:
        for name in blocks:
            _gather_full_width_norms(model.get_submodule(name), tp, tracer)
    if sharded == 0:
        raise AisimError(f"tensor parallelism found no linear layers to shard in {type(model).__name__}; "
                         "this model family is not supported with --tp yet")
    return sharded


def _grad_allreduce_blocks(blocks: set[str], moe: set[str]) -> set[str]:
    """The modules whose input gradient is all-reduced in backward (Megatron's f): each block with sharded
    linears, but one MoE block for everything inside it (a shared expert, the experts), as Megatron does at the MoE
    layer's input (``moe``: _moe_blocks)."""
    return {_enclosing(name, moe) or name for name in blocks}


def _enclosing(name: str, blocks: set[str]) -> str | None:
    """The block of ``blocks`` that module ``name`` sits inside, if any."""
    return next((b for b in blocks if name.startswith(b + ".")), None)


def _moe_blocks(model) -> set[str]:
    """The names of the modules holding an experts module (the MoE blocks), in one pass over the modules."""
    experts = {id(m) for m in expert_modules(model)}
    return {name.rpartition(".")[0] for name, m in model.named_modules() if id(m) in experts}


def _hook_grad_allreduce(module, tracer, tp: int) -> None:
    """Once per module: shard_model and shard_experts may both reach an MoE block."""
    if not getattr(module, "_aisim_grad_allreduce", False):
        module.register_forward_pre_hook(_backward_allreduce_hook(tracer, tp), with_kwargs=True)
        module._aisim_grad_allreduce = True


def _gather_full_width_norms(block, tp: int, tracer) -> None:
    """A q/k norm over all heads (OLMoE, OLMo 2: RMSNorm(heads x head_dim), not per head) needs the whole row:
    each rank all-gathers its q (k) shard, normalises the full width and keeps its own slice, as vLLM's
    OlmoeAttention._apply_qk_norm (vllm/model_executor/models/olmoe.py). Per-head norms (Qwen3) shard freely."""
    for leaf in ("q_norm", "k_norm"):
        norm, proj = getattr(block, leaf, None), getattr(block, leaf.replace("_norm", "_proj"), None)
        weight = getattr(norm, "weight", None)
        if proj is None or not is_linear(proj) or not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1:
            continue
        local = _features(proj, "out")
        if weight.shape[0] <= local or weight.shape[0] % local:
            continue
        group = weight.shape[0] // local
        norm.register_forward_pre_hook(_gather_hook(tracer, group))
        norm.register_forward_hook(lambda module, args, output, local=local: output[..., :local])


def _gather_hook(tracer, group: int):
    """Forward pre-hook: the module's input all-gathered along its last dimension over ``group`` ranks."""
    def hook(module, args):
        # also while the tracer is suppressed (a decode step's cache prefill): the norm needs the full width
        return (_all_gather(tracer, args[0], group), *args[1:]) if args else None
    return hook


def _all_gather(tracer, x, group: int):
    return _AllGather.apply(x, tracer, group)


class _AllGather(torch.autograd.Function):
    """Forward: all-gather along the last dimension (recorded unless the tracer is suppressed). Backward: the
    gradient of the full width reduce-scattered back to this rank's shard."""

    @staticmethod
    def forward(ctx, x, tracer, group):
        ctx.tracer, ctx.group = tracer, group
        suppressed = tracer.suppress
        with tracer.suppressed():
            full = x.new_empty((*x.shape[:-1], x.shape[-1] * group))
        if not suppressed:
            tracer.record("nccl.all_gather", (x,), {}, (full,), alias=False, attrs={"group": group})
            tracer.track(full)
        return full

    @staticmethod
    def backward(ctx, grad):
        tracer, group = ctx.tracer, ctx.group
        with tracer.suppressed():
            shard = grad.new_empty((*grad.shape[:-1], grad.shape[-1] // group))
        if not tracer.suppress:
            tracer.record("nccl.reduce_scatter", (grad,), {}, (shard,), alias=False, attrs={"group": group})
            tracer.track(shard)
        return shard, None, None


EXPERT_WEIGHTS = ("gate_up_proj", "up_proj", "down_proj")


def expert_modules(model) -> list:
    """HF 5.x fused expert modules: (E, ., .) weight tensors (gate_up_proj / up_proj, down_proj) and num_experts."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "num_experts", None), int)
            and any(isinstance(getattr(m, w, None), torch.nn.Parameter) and getattr(m, w).dim() == 3
                    for w in EXPERT_WEIGHTS)]


def shard_experts(model, tp: int, ep: int, tracer) -> int:
    """Shard every fused expert module for one rank, as vLLM's FusedMoE does; returns how many were sharded.

    ep > 1: expert parallelism, E / ep whole experts per GPU (vLLM --enable-expert-parallel: the EP group is the
    tp x dp GPUs of a stage; each rank computes its experts for the tokens routed to them). The rest of the tp
    degree (tp / ep when ep < tp) splits each expert's intermediate dimension: gate/up column-parallel, down
    row-parallel (vLLM's TP of expert weights, Megatron's scheme per expert). The expert outputs are
    all-reduced over the tp ranks (tokens are replicated across them); where ep spans data-parallel ranks
    (ep > tp) the routed tokens travel by all-to-all, dispatch before the experts and combine after
    (DeepSpeed-MoE / GShard). Routers and shared experts are left to shard_model (dense linears)."""
    found = expert_modules(model)
    if (tp == 1 and ep == 1) or not found:
        return 0
    inner_tp = max(tp // ep, 1) if ep <= tp else 1
    for m in found:
        _slice_experts(m, ep, inner_tp)
        if tp > 1:
            m.register_forward_hook(_collective_hook(tracer, "all_reduce", tp))
            # each tp rank's experts give a partial gradient of the replicated tokens (Megatron's f), all-reduced
            # once at the MoE block's input with its shared expert's
            _hook_grad_allreduce(_parent(model, m), tracer, tp)
        if ep > tp:
            m.register_forward_pre_hook(_all_to_all(tracer, ep, model.config, "dispatch"))
            m.register_forward_hook(_all_to_all(tracer, ep, model.config, "combine"))
    return len(found)


def _parent(model, module):
    name = next(n for n, m in model.named_modules() if m is module)
    return model.get_submodule(name.rpartition(".")[0])


def _slice_experts(m, ep: int, inner_tp: int) -> None:
    """Keep E / ep experts, and 1 / inner_tp of each expert's intermediate dimension."""
    transposed = bool(getattr(m, "is_transposed", False))
    for name in (*EXPERT_WEIGHTS, *(f"{w}_bias" for w in EXPERT_WEIGHTS)):
        p = getattr(m, name, None)
        if not isinstance(p, torch.nn.Parameter):
            continue
        shape = list(p.shape)
        shape[0] //= ep
        down = name.startswith("down_proj")
        if p.dim() == 3:
            # intermediate axis: gate_up (E, 2I, H) / down (E, H, I); transposed: (E, H, 2I) / (E, I, H)
            axis = (1 if transposed else 2) if down else (2 if transposed else 1)
            shape[axis] //= inner_tp
        elif not down:           # gate_up bias (E, 2I); down's bias (E, H) is not split
            shape[1] //= inner_tp
        setattr(m, name, torch.nn.Parameter(torch.empty(shape, device="meta", dtype=p.dtype)))
    m.num_experts //= ep
    for attr in ("intermediate_dim", "intermediate_size", "expert_dim"):
        if isinstance(getattr(m, attr, None), int):
            setattr(m, attr, getattr(m, attr) // inner_tp)


def _routed_copy(tracer, hidden, config, ep: int):
    top_k = int(config.num_experts_per_tok)
    with tracer.suppressed():
        return hidden.new_empty((hidden.shape[0] * top_k, hidden.shape[-1]))


def _all_to_all(tracer, ep: int, config, direction: str):
    """A hook recording the expert-parallel all-to-all of the routed tokens: ``dispatch`` as a forward pre-hook
    (module, args) on the experts' input, ``combine`` as a forward hook (module, args, output) on their output; in
    backward each one's gradient travels back by the same all-to-all (Megatron's token dispatcher: the
    all-to-all's autograd function is an all-to-all). The group (ep > tp) is ep consecutive GPUs, whole tp groups
    each holding whole experts (Megatron's expert tensor parallel 1, vLLM's EP), the layout step.state_groups'
    expert data-parallel groups (ranks max(tp, ep) apart) assume: ``stride`` 1, which places it on nodes
    (cost.comm). With full recompute the recomputed forward runs the dispatch again and the combine where the
    checkpoint's early stop reaches it (5-6 all-to-alls per MoE layer)."""
    attrs = {"group": ep, "moe": direction, "stride": 1}

    def hook(module, args, *output):
        if tracer.suppress or not args:
            return None
        if direction == "dispatch":
            return (_AllToAll.apply(args[0], tracer, config, attrs), *args[1:])
        return _AllToAll.apply(output[0], tracer, config, attrs) if isinstance(output[0], torch.Tensor) else None
    return hook


class _AllToAll(torch.autograd.Function):
    """Forward and backward: the all-to-all of the routed rows (tokens x top-k of them) of ``x``'s tokens."""

    @staticmethod
    def forward(ctx, x, tracer, config, attrs):
        ctx.tracer, ctx.config, ctx.attrs = tracer, config, attrs
        routed = _routed_copy(tracer, x, config, attrs["group"])
        tracer.record("nccl.all_to_all", (routed,), {}, (routed,), alias=False, attrs=dict(attrs))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.tracer.suppress:
            routed = _routed_copy(ctx.tracer, grad, ctx.config, ctx.attrs["group"])
            ctx.tracer.record("nccl.all_to_all", (routed,), {}, (routed,), alias=False,
                              attrs=dict(ctx.attrs, backward=True))
        return grad, None, None, None


def _features(linear, side: str) -> int:
    if isinstance(linear, torch.nn.Linear):
        return linear.out_features if side == "out" else linear.in_features
    return linear.nf if side == "out" else linear.nx


def _resize(linear, out_features: int | None = None, in_features: int | None = None) -> None:
    out_f = out_features or _features(linear, "out")
    in_f = in_features or _features(linear, "in")
    dtype = linear.weight.dtype
    shape = (out_f, in_f) if isinstance(linear, torch.nn.Linear) else (in_f, out_f)   # Conv1D: (nx, nf)
    linear.weight = torch.nn.Parameter(torch.empty(shape, device="meta", dtype=dtype))
    if linear.bias is not None and out_features:
        linear.bias = torch.nn.Parameter(torch.empty(out_f, device="meta", dtype=dtype))
    if isinstance(linear, torch.nn.Linear):
        linear.out_features, linear.in_features = out_f, in_f
    else:
        linear.nf, linear.nx = out_f, in_f


def _vocab_parallel_embedding(model, head, tp: int, tracer) -> None:
    """With a vocab-parallel LM head the input embedding is vocab-parallel too, as Megatron's and vLLM's
    VocabParallelEmbedding (vllm/model_executor/layers/vocab_parallel_embedding.py): it holds vocab / tp rows (the
    head's own, where the two are tied) and its output is all-reduced (each rank looks up only the ids in its
    slice)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embed is None or not isinstance(getattr(embed, "weight", None), torch.nn.Parameter):
        return
    if getattr(model.config, "tie_word_embeddings", False):
        embed.weight = head.weight
    else:
        old = embed.weight
        embed.weight = torch.nn.Parameter(torch.empty(old.shape[0] // tp, *old.shape[1:], device="meta",
                                                      dtype=old.dtype), requires_grad=old.requires_grad)
    embed.num_embeddings = embed.weight.shape[0]
    if getattr(embed, "padding_idx", None) is not None and embed.padding_idx >= embed.num_embeddings:
        embed.padding_idx = None     # the padding row is in another rank's slice; the lookup costs the same
    embed.register_forward_hook(_collective_hook(tracer, "all_reduce", tp))


def _vocab_parallel_loss(tracer, tp: int):
    """The head's output stays vocab-sharded and the loss runs on this rank's logits, as Megatron's
    _VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py): in forward three all-reduces of
    one fp32 value per token, the logits' max (MAX), the target's logit and the sum of exponentials (SUM; the fused
    variant, --cross-entropy-loss-fusion, concatenates these two); none in backward (each rank's softmax gradient
    is local)."""
    def hook(module, args, output):
        if tracer.suppress or not isinstance(output, torch.Tensor):
            return None
        with tracer.suppressed():
            per_token = output.new_empty(output.shape[:-1], dtype=torch.float32)
        for _ in range(3):
            tracer.record("nccl.all_reduce", (per_token,), {}, (per_token,), alias=True, attrs={"group": tp})
        return None
    return hook


def _collective_hook(tracer, kind: str, group: int):
    def hook(module, args, output):
        if tracer.suppress:
            return None
        if kind == "all_gather":
            return _all_gather(tracer, output, group)
        return _AllReduce.apply(output, tracer, group)
    return hook


def _backward_allreduce_hook(tracer, group: int):
    def hook(module, args, kwargs):
        if tracer.suppress:
            return None
        if "hidden_states" in kwargs:
            kwargs = dict(kwargs, hidden_states=_GradAllReduce.apply(kwargs["hidden_states"], tracer, group))
            return args, kwargs
        if args:
            return (_GradAllReduce.apply(args[0], tracer, group), *args[1:]), kwargs
        return None
    return hook


class _AllReduce(torch.autograd.Function):
    """Forward: all-reduce of a row-parallel output (Megatron's g). Backward: identity."""

    @staticmethod
    def forward(ctx, x, tracer, group):
        tracer.record("nccl.all_reduce", (x,), {}, (x,), alias=True, attrs={"group": group})
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GradAllReduce(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce of the block input's gradient (Megatron's f)."""

    @staticmethod
    def forward(ctx, x, tracer, group):
        ctx.tracer, ctx.group = tracer, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.tracer.record("nccl.all_reduce", (grad,), {}, (grad,), alias=True, attrs={"group": ctx.group})
        return grad, None, None
