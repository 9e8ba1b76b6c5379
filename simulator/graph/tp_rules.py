"""Tensor-parallel rules per model family, as data: which linear layers are column- or row-parallel (HF module
attribute names across families) and which config dimensions a TP degree must divide for each scope. One table,
read by the default-plan search (aisim.plan) and by the sharding of the traced model (aisim.graph.sharding).

Megatron-LM's scheme (Shoeybi et al. 2019, sec. 3): attention's Q/K/V and the MLP's first projections are split
by output features (column), the attention output and the MLP's last projection by input features (row).
GPT-2's Conv1D layers (c_attn, c_fc column; c_proj row) are named here too.
"""
from __future__ import annotations

COLUMN_ATTENTION = frozenset({"q_proj", "k_proj", "v_proj", "query_key_value", "qkv_proj", "Wqkv", "c_attn",
                              "q_b_proj", "kv_b_proj"})  # MLA (DeepSeek): per-head up-projections; the
# low-rank down-projections (q_a_proj, kv_a_proj_with_mqa) stay replicated, as vLLM shards them
ROW_ATTENTION = frozenset({"o_proj", "out_proj", "dense", "Wo"})
COLUMN_MLP = frozenset({"gate_proj", "up_proj", "fc1", "dense_h_to_4h", "w1", "w3", "gate_up_proj", "c_fc"})
ROW_MLP = frozenset({"down_proj", "fc2", "dense_4h_to_h", "w2"})
# GPT-2 names both projections c_proj: the one inside ``attn`` is the attention output, inside ``mlp`` the MLP's.
ROW_BY_PARENT = {"c_proj": {"attn": "attention", "mlp": "mlp"}}
HEAD_ATTRS = ("num_heads", "num_key_value_heads", "num_attention_heads", "n_head", "split_size")

# Config keys (first present wins) of the dimensions each scope shards.
HEAD_KEYS = ("num_attention_heads", "n_head", "encoder_attention_heads")
KV_HEAD_KEYS = ("num_key_value_heads",)
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
FFN_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "encoder_ffn_dim")
SCOPE_PARTS = {"all": ("attention", "mlp"), "full": ("attention", "mlp"), "layers": ("attention", "mlp"),
               "attention": ("attention",), "mlp": ("mlp",)}


def _first(config: dict, keys: tuple[str, ...]):
    return next((config[k] for k in keys if config.get(k)), None)


def tp_dims(config: dict, scope: str) -> dict[str, int]:
    """The config dimensions a tensor-parallel degree must divide for ``scope``."""
    dims: dict[str, int] = {}
    parts = SCOPE_PARTS[scope]
    heads = _first(config, HEAD_KEYS)
    if "attention" in parts and heads:
        dims["num_attention_heads"] = heads
        kv = _first(config, KV_HEAD_KEYS)
        if kv:
            dims["num_key_value_heads"] = kv
    if "mlp" in parts:
        hidden = _first(config, HIDDEN_KEYS) or 0
        ffn = _first(config, FFN_KEYS) or 4 * hidden
        if ffn:
            dims["intermediate_size"] = ffn
    return dims


def roles(scope: str) -> tuple[set[str], set[str]]:
    """(column-parallel, row-parallel) module names sharded under ``scope``."""
    parts = SCOPE_PARTS[scope]
    column = set(COLUMN_MLP) if "mlp" in parts else set()
    row = set(ROW_MLP) if "mlp" in parts else set()
    if "attention" in parts:
        column |= COLUMN_ATTENTION
        row |= ROW_ATTENTION
    return column, row


def row_role(leaf: str, parent: str, scope: str) -> bool:
    """Whether a module named ``leaf`` under ``parent`` (its parent's attribute name) is row-parallel here."""
    part = ROW_BY_PARENT.get(leaf, {}).get(parent)
    return part is not None and part in SCOPE_PARTS[scope]
