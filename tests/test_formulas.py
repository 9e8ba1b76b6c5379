"""Exact, hand-worked numbers for the formula registry (a multiply-add is 2 FLOPs)."""
import pytest

from aisim.formulas import FORMULAS, attention_flops, attention_pairs, is_known, op_cost
from aisim.graph.ops import Op, TensorMeta


def T(*shape, dtype="fp16"):
    return TensorMeta(tuple(shape), dtype)


def op(name, args, outputs, **attrs):
    return Op(name=name, args=tuple(args), kwargs={}, outputs=tuple(outputs), alias=False, attrs=attrs)


def test_mm_flops_and_bytes():
    c = op_cost(op("aten.mm", [T(4, 6), T(6, 5)], [T(4, 5)]))
    assert c.flops == 240  # 2 * 4 * 5 * 6 = 240
    assert c.bytes_read == (24 + 30) * 2 and c.bytes_written == 20 * 2
    assert c.kind == "gemm" and c.launches == 1


def test_addmm_adds_the_bias():
    c = op_cost(op("aten.addmm", [T(5), T(4, 6), T(6, 5)], [T(4, 5)]))
    assert c.flops == 240 + 20  # 2*4*5*6 + 4*5 bias adds


def test_bmm():
    c = op_cost(op("aten.bmm", [T(3, 4, 6), T(3, 6, 5)], [T(3, 4, 5)]))
    assert c.flops == 720  # 3 * 2 * 4 * 5 * 6


def test_attention_causal_is_the_lower_triangle():
    q = k = v = T(2, 8, 16, 64)
    assert attention_pairs(q, k, False) == 256
    assert attention_pairs(q, k, True) == 136  # 16 * 17 / 2
    # 2 matmuls * 2 FLOPs * (B*H = 16) * pairs * D
    assert attention_flops(q, k, v, True) == 4 * 16 * 136 * 64
    c = op_cost(op("attention.flash", [q, k, v, None], [q], is_causal=True))
    assert c.flops == 4 * 16 * 136 * 64
    assert c.bytes == 4 * q.nbytes


def test_attention_decode_step_is_one_query_over_the_cache():
    q, k = T(1, 32, 1, 128), T(1, 32, 1000, 128)
    assert attention_pairs(q, k, True) == 1000  # 1 * (1000 - 1) + 1
    assert attention_flops(q, k, k, False) == 4 * 32 * 1000 * 128


def test_flash_backward_is_two_and_a_half_forward():
    q = T(1, 4, 32, 16)
    fwd = op_cost(op("attention.flash", [q, q, q, None], [q], is_causal=False))
    bwd = op_cost(op("attention.flash_backward", [q, q, q, q, q], [q, q, q], is_causal=False))
    assert bwd.flops == pytest.approx(2.5 * fwd.flops)


def test_embedding_reads_only_the_rows_it_gathers():
    c = op_cost(op("aten.embedding", [T(50000, 64), T(2, 10, dtype="int64")], [T(2, 10, 64)]))
    assert c.bytes_written == 2 * 10 * 64 * 2
    assert c.bytes_read == 2 * 10 * 64 * 2 + 2 * 10 * 8  # rows + int64 indices, not the 50000-row table


def test_views_are_free_and_unknown_ops_are_not_silently_zero():
    view = op("aten.view", [T(4, 4)], [T(16)], view=True)
    assert op_cost(view).launches == 0 and is_known(view)
    unknown = op("aten.some_new_kernel", [T(1000)], [T(1000)])
    assert not is_known(unknown)
    assert op_cost(unknown).bytes == 4000  # costed as a copy, and reported by the estimate


def test_adamw_moves_seven_streams():
    c = op_cost(op("optimizer.adamw", [T(1000, dtype="fp32")], [], n_tensors=220))
    assert c.bytes_read == 4 * 1000 * 4 and c.bytes_written == 3 * 1000 * 4
    assert c.launches == 10 * 2  # 10 foreach kernels, 220 tensors at 110 per launch


def test_registry_has_no_duplicate_names():
    assert len(FORMULAS) == len(set(FORMULAS))
