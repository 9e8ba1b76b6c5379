"""Megatron-style tensor parallelism on a plain HF model: sharded weights plus all-reduce hooks.

``shard_model(model, rank, world, scope)`` slices the weights of every attention and MLP block in place:

- MoE experts stored as 3D parameters (transformers 5: Mixtral, Qwen2/3-MoE, OLMoE): every expert's intermediate
  features split (gate_up_proj's gate and up halves column-wise, down_proj row-wise), the experts' output
  all-reduced, the router replicated (transformers' own TP plan for Mixtral: packed_colwise / rowwise /
  moe_tp_experts); a shared expert is an MLP block below;
- column-parallel (output features split, heads kept whole): Llama q/k/v/gate/up_proj, OPT q/k/v_proj and fc1,
  BLOOM query_key_value (fused per head: [heads, 3, head_dim] rows) and dense_h_to_4h;
- row-parallel (input features split, bias kept on rank 0 only): Llama o_proj/down_proj, OPT out_proj/fc2,
  BLOOM self_attention.dense and dense_4h_to_h. A forward hook all-reduces (SUM) each row-parallel output
  ("g": all-reduce forward, identity backward); a pre-hook on each block's input is Megatron's "f"
  (identity forward, all-reduce of the input gradient backward), so forward-backward also has the right
  collectives: 2 all-reduces per layer forward, 2 backward.

Head-count attributes used by the attention code (``num_heads``) are divided by ``world``; BLOOM's ALiBi
tensor is built for all heads and sliced to this rank's heads. Embeddings, norms and the LM head stay
replicated (not vocab-parallel): every rank computes the full logits. ``scope='mlp'`` shards only the MLPs
(TorchCAP's plan). Plain tensors and ``torch.distributed.all_reduce`` are used, not DTensor
``parallelize_module`` (measured 14x slower for the same sharding).
"""
from __future__ import annotations

from dataclasses import dataclass, field

TP_IMPL = "plain-sharded-allreduce-hooks"


@dataclass
class _Block:
    """One attention or MLP block: its entry module (whose first input is replicated), column and row linears."""
    kind: str                       # "attention" or "mlp"
    entry: object                   # nn.Module whose first input gets the "f" operator
    column: list = field(default_factory=list)    # (linear, layout) with layout "plain" or "bloom-qkv"
    row: list = field(default_factory=list)
    heads_owner: object | None = None             # attention module whose head attributes are divided


def _has(module, *names: str) -> bool:
    return all(hasattr(module, n) for n in names)


def find_blocks(model) -> list[_Block]:
    """Attention and MLP blocks of a Llama-, OPT- or BLOOM-style model, in module order."""
    blocks = []
    for _, m in model.named_modules():
        if _has(m, "q_proj", "k_proj", "v_proj") and (hasattr(m, "o_proj") or hasattr(m, "out_proj")):
            out = m.o_proj if hasattr(m, "o_proj") else m.out_proj
            blocks.append(_Block("attention", m, [(m.q_proj, "plain"), (m.k_proj, "plain"), (m.v_proj, "plain")],
                                 [out], m))
        elif _has(m, "gate_proj", "up_proj", "down_proj"):
            blocks.append(_Block("mlp", m, [(m.gate_proj, "plain"), (m.up_proj, "plain")], [m.down_proj]))
        elif _has(m, "query_key_value", "dense"):
            blocks.append(_Block("attention", m, [(m.query_key_value, "bloom-qkv")], [m.dense], m))
        elif _has(m, "dense_h_to_4h", "dense_4h_to_h"):
            blocks.append(_Block("mlp", m, [(m.dense_h_to_4h, "plain")], [m.dense_4h_to_h]))
        elif _has(m, "fc1", "fc2") and not _has(m, "gate_proj"):
            blocks.append(_Block("mlp", m.fc1, [(m.fc1, "plain")], [m.fc2]))
        elif _expert_params(m) is not None:
            blocks.append(_Block("experts", m))
        elif getattr(getattr(m, "gate_up_proj", None), "ndim", 0) == 3:
            raise ValueError(f"{type(m).__name__}: experts stored as {tuple(m.gate_up_proj.shape)} (not [experts, "
                             "2 x intermediate, hidden] with gate rows then up rows, e.g. gpt-oss's interleaved "
                             "layout): their tensor-parallel split is not supported; leaving them whole would "
                             "misstate the memory per GPU")
    return blocks


def _expert_params(m):
    """(gate_up_proj, down_proj) of a transformers 5 MoE experts module that stores every expert's weights as one
    3D parameter each, [experts, 2 x intermediate, hidden] (gate rows, then up rows) and [experts, hidden,
    intermediate] (Mixtral, Qwen2/3-MoE, OLMoE: models/*/modeling_*.py *Experts); None for anything else."""
    gate_up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    if getattr(gate_up, "ndim", 0) != 3 or getattr(down, "ndim", 0) != 3:
        return None
    experts, two_inter, hidden = gate_up.shape
    if two_inter % 2 or tuple(down.shape) != (experts, hidden, two_inter // 2):
        return None
    return gate_up, down


def _new_param(old, data):
    import torch

    return torch.nn.Parameter(data.clone().contiguous(), requires_grad=old.requires_grad)


def _shard_column(linear, rank: int, world: int, layout: str, heads: int | None = None) -> None:
    """Keep this rank's slice of the output features (rows of ``weight``)."""
    w, b = linear.weight, linear.bias
    out_features = w.shape[0]
    if out_features % world:
        raise ValueError(f"{linear}: {out_features} output features do not divide by tp={world}")
    if layout == "bloom-qkv":
        # rows are [heads, 3 (q,k,v), head_dim]: keep whole heads with their q, k and v together
        h = heads // world
        linear.weight = _new_param(w, w.view(heads, -1, w.shape[1])[rank * h:(rank + 1) * h].reshape(-1, w.shape[1]))
        if b is not None:
            linear.bias = _new_param(b, b.view(heads, -1)[rank * h:(rank + 1) * h].reshape(-1))
    else:
        n = out_features // world
        linear.weight = _new_param(w, w[rank * n:(rank + 1) * n])
        if b is not None:
            linear.bias = _new_param(b, b[rank * n:(rank + 1) * n])
    linear.out_features = linear.weight.shape[0]


def _shard_row(linear, rank: int, world: int) -> None:
    """Keep this rank's slice of the input features (columns of ``weight``); the bias only on rank 0."""
    w = linear.weight
    if w.shape[1] % world:
        raise ValueError(f"{linear}: {w.shape[1]} input features do not divide by tp={world}")
    n = w.shape[1] // world
    linear.weight = _new_param(w, w[:, rank * n:(rank + 1) * n])
    linear.in_features = n
    if linear.bias is not None and rank != 0:
        linear.bias = None


def _rank_share(size: int, rank: int, world: int, what: str, degree: str) -> tuple[int, slice]:
    """(size / world, this rank's slice of range(size)); ValueError naming ``what`` where world does not divide it."""
    if size % world:
        raise ValueError(f"{what} ({size}) does not divide by {degree}={world}")
    n = size // world
    return n, slice(rank * n, (rank + 1) * n)


def _shard_experts(experts, rank: int, world: int) -> None:
    """Megatron's split of every expert (as transformers' TP plan for Mixtral: gate_up_proj packed_colwise,
    down_proj rowwise): this rank keeps its slice of each expert's intermediate features, in the gate half and in
    the up half of gate_up_proj, and the matching columns of down_proj; the experts' output is then a partial sum
    that the forward hook all-reduces. A down-projection bias stays on rank 0 only (zeros elsewhere)."""
    import torch

    gate_up, down = _expert_params(experts)
    inter = down.shape[2]
    n, keep = _rank_share(inter, rank, world, f"{type(experts).__name__}: expert intermediate size", "tp")

    def halves(t):   # this rank's slice of the gate half, then of the up half (dim 1)
        return torch.cat([t[:, :inter][:, keep], t[:, inter:][:, keep]], dim=1)

    experts.gate_up_proj = _new_param(gate_up, halves(gate_up))
    experts.down_proj = _new_param(down, down[:, :, keep])
    bias = getattr(experts, "gate_up_proj_bias", None)
    if bias is not None:
        experts.gate_up_proj_bias = _new_param(bias, halves(bias))
    bias = getattr(experts, "down_proj_bias", None)
    if bias is not None and rank != 0:
        experts.down_proj_bias = _new_param(bias, torch.zeros_like(bias))
    for name in ("intermediate_dim", "intermediate_size", "expert_dim"):
        value = getattr(experts, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value == inter:
            setattr(experts, name, n)


def _shard_experts_by_index(experts, rank: int, world: int) -> None:
    """Expert parallelism as transformers' EP plan runs it in eager (integrations/moe.py grouped_mm_experts_forward,
    'EP sentinel handling'): this rank keeps experts [rank x E/world, (rank + 1) x E/world) whole; a pre-hook maps
    the router's expert ids to local ones and every other expert to the sentinel E/world, which the grouped GEMMs
    skip (histc drops it) and whose rows are zeroed, so the experts' output is this rank's partial sum, all-reduced
    by the output hook. The router stays whole."""
    import torch

    gate_up, down = _expert_params(experts)
    n, keep = _rank_share(gate_up.shape[0], rank, world, f"{type(experts).__name__}: the experts", "ep")
    experts.gate_up_proj = _new_param(gate_up, gate_up[keep])
    experts.down_proj = _new_param(down, down[keep])
    for name in ("gate_up_proj_bias", "down_proj_bias"):
        bias = getattr(experts, name, None)
        if bias is not None:
            setattr(experts, name, _new_param(bias, bias[keep]))
    experts.num_experts = n

    def local_ids(module, args, kwargs):
        ids = args[1] if len(args) > 1 else kwargs["top_k_index"]
        local = ids - rank * n
        local = torch.where((local < 0) | (local >= n), torch.full_like(local, n), local)
        if len(args) > 1:
            return (args[0], local, *args[2:]), kwargs
        return args, {**kwargs, "top_k_index": local}
    experts.register_forward_pre_hook(local_ids, with_kwargs=True)


def _attention_heads(block: _Block) -> tuple[int, int]:
    """(query heads, key/value heads) of an attention block, from its weight shapes and head_dim."""
    attn = block.heads_owner
    head_dim = attn.head_dim
    linear, layout = block.column[0]
    if layout == "bloom-qkv":
        heads = linear.weight.shape[0] // (3 * head_dim)
        return heads, heads
    return linear.weight.shape[0] // head_dim, block.column[1][0].weight.shape[0] // head_dim


def _divide_head_attrs(attn, world: int) -> None:
    for name in ("num_heads", "num_attention_heads", "num_key_value_heads", "n_heads"):
        value = getattr(attn, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(attn, name, value // world)


class _AllReduceForward:
    """Megatron "g": all-reduce (SUM) in forward, identity in backward."""
    _fn = None

    @classmethod
    def apply(cls, x, group):
        if cls._fn is None:
            import torch
            import torch.distributed as dist

            class G(torch.autograd.Function):
                @staticmethod
                def forward(ctx, t, grp):
                    ctx.mark_dirty(t)
                    dist.all_reduce(t, group=grp)
                    return t

                @staticmethod
                def backward(ctx, grad):
                    return grad, None

            cls._fn = G
        return cls._fn.apply(x, group)


class _AllReduceBackward:
    """Megatron "f": identity in forward, all-reduce (SUM) of the gradient in backward."""
    _fn = None

    @classmethod
    def apply(cls, x, group):
        if cls._fn is None:
            import torch
            import torch.distributed as dist

            class F(torch.autograd.Function):
                @staticmethod
                def forward(ctx, t, grp):
                    ctx.grp = grp
                    return t.view_as(t)

                @staticmethod
                def backward(ctx, grad):
                    grad = grad.contiguous()
                    dist.all_reduce(grad, group=ctx.grp)
                    return grad, None

            cls._fn = F
        return cls._fn.apply(x, group)


def _row_output_hook(group):
    def hook(module, args, output):
        import torch
        import torch.distributed as dist

        if torch.is_grad_enabled() and output.requires_grad:
            return _AllReduceForward.apply(output, group)
        dist.all_reduce(output, group=group)
        return output
    return hook


def _entry_pre_hook(group):
    def hook(module, args, kwargs):
        import torch

        if not torch.is_grad_enabled():
            return None
        if args and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
            return (_AllReduceBackward.apply(args[0], group), *args[1:]), kwargs
        x = kwargs.get("hidden_states")
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return args, {**kwargs, "hidden_states": _AllReduceBackward.apply(x, group)}
        return None
    return hook


def _experts_pre_hook(group):
    """Megatron's "f" on both inputs of a split experts module that carry gradient: the hidden states and the
    routing weights (experts(hidden_states, top_k_index, top_k_weights)), each rank's gradient of either being a
    partial sum over its slice of every expert."""
    def hook(module, args, kwargs):
        import torch

        if not torch.is_grad_enabled():
            return None
        args = tuple(_AllReduceBackward.apply(a, group) if i in (0, 2) and isinstance(a, torch.Tensor)
                     and a.requires_grad else a for i, a in enumerate(args))
        kwargs = {k: _AllReduceBackward.apply(v, group) if k in ("hidden_states", "top_k_weights")
                  and isinstance(v, torch.Tensor) and v.requires_grad else v for k, v in kwargs.items()}
        return args, kwargs
    return hook


def _slice_bloom_alibi(model, rank: int, world: int) -> None:
    """BLOOM builds ALiBi for ``num_heads`` heads of the whole model: build it for all, keep this rank's heads."""
    transformer = getattr(model, "transformer", None)
    if transformer is None or not hasattr(transformer, "build_alibi_tensor"):
        return
    full_builder = transformer.build_alibi_tensor

    def build(attention_mask, num_heads, dtype):
        alibi = full_builder(attention_mask, num_heads, dtype)   # [batch * heads, 1, kv_len]
        batch, h = attention_mask.shape[0], num_heads // world
        return alibi.view(batch, num_heads, 1, -1)[:, rank * h:(rank + 1) * h].reshape(batch * h, 1, -1)

    transformer.build_alibi_tensor = build


def shard_model(model, rank: int, world: int, scope: str = "all", group=None, experts_by_index: bool = False):
    """Shard ``model`` in place for tensor-parallel rank ``rank`` of ``world``; returns it. ``experts_by_index``:
    MoE experts split by index instead (expert parallelism over the same GPUs, aisim --ep; _shard_experts_by_index).

    ``scope``: 'all' (attention and MLP) or 'mlp'. Needs torch.distributed initialised only when the model
    runs (the hooks call all_reduce on ``group``, the default group if None). Raises ValueError for a model
    with no recognised blocks or heads that do not divide by ``world``.
    """
    if scope not in ("all", "mlp"):
        raise ValueError(f"tp scope {scope!r}: use 'all' or 'mlp'")
    if world == 1:
        return model
    blocks = [b for b in find_blocks(model) if scope == "all" or b.kind in ("mlp", "experts")]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no Llama-, OPT- or BLOOM-style attention/MLP blocks or MoE "
                         "experts found to shard; tensor parallelism supports those architectures")
    for block in blocks:
        if block.kind == "experts":
            if experts_by_index:
                _shard_experts_by_index(block.entry, rank, world)
            else:
                _shard_experts(block.entry, rank, world)
            block.entry.register_forward_hook(_row_output_hook(group))
            block.entry.register_forward_pre_hook(_experts_pre_hook(group), with_kwargs=True)
            continue
        heads = None
        if block.kind == "attention":
            heads, kv_heads = _attention_heads(block)
            if heads % world or kv_heads % world:
                raise ValueError(f"{type(model).__name__}: {heads} query / {kv_heads} key-value heads do not "
                                 f"divide by tp={world}")
            _divide_head_attrs(block.heads_owner, world)
        for linear, layout in block.column:
            _shard_column(linear, rank, world, layout, heads)
        for linear in block.row:
            _shard_row(linear, rank, world)
            linear.register_forward_hook(_row_output_hook(group))
        block.entry.register_forward_pre_hook(_entry_pre_hook(group), with_kwargs=True)
    if scope == "all" and any(b.column and b.column[0][1] == "bloom-qkv" for b in blocks):
        _slice_bloom_alibi(model, rank, world)
        for layer in getattr(getattr(model, "transformer", None), "h", []):
            _divide_head_attrs(layer, world)
    model.aisim_tp = {"rank": rank, "world": world, "scope": scope, "impl": TP_IMPL}
    return model
