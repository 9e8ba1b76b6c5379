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

# Linear layer names by role (HF module attribute names across model families); data, not logic.
COLUMN_ATTENTION = {"q_proj", "k_proj", "v_proj", "query_key_value", "qkv_proj", "Wqkv"}
ROW_ATTENTION = {"o_proj", "out_proj", "dense", "Wo"}
COLUMN_MLP = {"gate_proj", "up_proj", "fc1", "dense_h_to_4h", "w1", "w3", "gate_up_proj"}
ROW_MLP = {"down_proj", "fc2", "dense_4h_to_h", "w2"}
HEAD_ATTRS = ("num_heads", "num_key_value_heads", "num_attention_heads")


def _roles(scope: str) -> tuple[set[str], set[str]]:
    column, row = set(COLUMN_MLP), set(ROW_MLP)
    if scope in ("all", "full", "attention"):
        column |= COLUMN_ATTENTION
        row |= ROW_ATTENTION
    if scope == "attention":
        column -= COLUMN_MLP
        row -= ROW_MLP
    return column, row


def shard_model(model, tp: int, scope: str, tracer) -> int:
    """Shard the meta model in place for one rank; returns how many linears were sharded."""
    if tp == 1:
        return 0
    column, row = _roles(scope)
    sharded = 0
    blocks = set()
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if not isinstance(module, torch.nn.Linear):
            continue
        parent = name.rsplit(".", 1)[0]
        if leaf in column or (leaf == "lm_head" and scope == "full"):
            _resize(module, out_features=module.out_features // tp)
            if leaf == "lm_head":
                module.register_forward_hook(_collective_hook(tracer, "all_gather", tp))
            else:
                blocks.add(parent)
            sharded += 1
        elif leaf in row:
            _resize(module, in_features=module.in_features // tp)
            module.register_forward_hook(_collective_hook(tracer, "all_reduce", tp))
            sharded += 1
    heads_sharded = scope in ("all", "full", "attention")
    for name, module in model.named_modules():
        # head counts the code reshapes with: on attention blocks, and on model roots that build per-head
        # tensors for all blocks (BLOOM's ALiBi slopes)
        if heads_sharded and (name in blocks or not any(isinstance(c, torch.nn.Linear) for c in module.children())):
            for attr in HEAD_ATTRS:
                if isinstance(getattr(module, attr, None), int) and not isinstance(module, torch.nn.Linear):
                    setattr(module, attr, getattr(module, attr) // tp)
        if name in blocks:
            module.register_forward_pre_hook(_backward_allreduce_hook(tracer, tp), with_kwargs=True)
    if sharded == 0:
        raise AisimError(f"tensor parallelism found no linear layers to shard in {type(model).__name__}; "
                         "this model family is not supported with --tp yet")
    return sharded


def _resize(linear, out_features: int | None = None, in_features: int | None = None) -> None:
    out_f = out_features or linear.out_features
    in_f = in_features or linear.in_features
    dtype = linear.weight.dtype
    linear.weight = torch.nn.Parameter(torch.empty(out_f, in_f, device="meta", dtype=dtype))
    if linear.bias is not None and out_features:
        linear.bias = torch.nn.Parameter(torch.empty(out_f, device="meta", dtype=dtype))
    linear.out_features, linear.in_features = out_f, in_f


def _collective_hook(tracer, kind: str, group: int):
    def hook(module, args, output):
        if tracer.suppress:
            return None
        if kind == "all_gather":
            shape = (*output.shape[:-1], output.shape[-1] * group)
            tracer.suppress += 1
            full = output.new_empty(shape)
            tracer.suppress -= 1
            tracer.record(f"nccl.{kind}", (output,), {}, (full,), alias=False, attrs={"group": group})
            tracer.track(full)
            return full
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
