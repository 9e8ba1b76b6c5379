"""Engine-side work: bitsandbytes LLM.int8 matmuls, a serving loop per request, preallocated KV caches, and the
timeline's handling of per-layer host syncs."""
import numpy as np
import pytest

import aisim
from aisim.cost.timeline import simulate
from aisim.formulas import gemm_dims, op_cost
from aisim.graph.engine import BNB_OUTLIER_COLUMNS, bnb_int8_ops, expand, request_loop_ops
from aisim.graph.ops import Op, TensorMeta
from aisim.specs import all_runtimes
from aisim.workload import Workload


def _linear(m=8, k=64, n=32):
    return Op(name="aten.mm", args=(TensorMeta((m, k), "fp16"), TensorMeta((k, n), "fp16")), kwargs={},
              outputs=(TensorMeta((m, n), "fp16"),), alias=False, scope="model.layers.0.mlp.up_proj",
              attrs={"weight_bytes": 2.0 * k * n})


def test_bnb_int8_linear_expands_to_its_source_sequence():
    op = _linear()
    ops = bnb_int8_ops(op)
    names = [o.name for o in ops]
    assert names.count("aten._local_scalar_dense") == 2          # nnz .item() and torch.unique
    gemm = ops[names.index("bnb.igemmlt")]
    assert op_cost(gemm).flops == pytest.approx(2 * 8 * 64 * 32) and gemm.inputs[1].dtype == "int8"
    outlier_mm = [o for o in ops if o.name == "aten.mm"][0]
    assert gemm_dims(outlier_mm)[1:] == (8, 32, BNB_OUTLIER_COLUMNS)
    ops2, reps = expand([op, op], [3.0, 1.0], Workload(quant="bitsandbytes-int8"), all_runtimes()["eager"], 100, 1)
    assert len(ops2) == 2 * len(ops) and reps[:len(ops)] == [3.0] * len(ops)
    same, _ = expand([op], [1.0], Workload(), all_runtimes()["eager"], 100, 1)
    assert same == [op]


def test_int8_is_slower_than_fp16_for_small_batches():
    kw = dict(model="bloom-560m", device="h100", workload="decode", batch=1, seq=128)
    fp16, int8 = aisim.estimate(**kw), aisim.estimate(quant="bitsandbytes-int8", **kw)
    assert int8.runtime_ms > 1.5 * fp16.runtime_ms
    assert int8.memory.weights_gb < fp16.memory.weights_gb


def test_request_loop_costs_scale_with_batch_and_prompt_rows():
    rt = all_runtimes()["tgi-2023"]
    prefill = request_loop_ops(rt, Workload(phase="prefill", seq=100), vocab=1000)
    decode = request_loop_ops(rt, Workload(phase="decode", seq=100), vocab=1000)
    assert op_cost(prefill[0]).bytes == pytest.approx(100 * op_cost(decode[0]).bytes)   # all prompt rows
    assert len(prefill) - len(decode) == rt.request_loop.prefill_syncs
    kw = dict(model="opt-125m", device="h100", workload="decode", seq=128)
    eager = [aisim.estimate(batch=b, **kw).runtime_ms for b in (1, 16)]
    tgi = [aisim.estimate(batch=b, runtime="tgi-2023", **kw).runtime_ms for b in (1, 16)]
    assert tgi[1] - tgi[0] > eager[1] - eager[0]   # per-request Python and syncs grow with the batch
    assert tgi[0] > eager[0] + rt.per_step_overhead_s * 1e3 * 0.99


def test_tgi_prefill_computes_every_position_logits():
    kw = dict(model="opt-125m", device="h100", workload="prefill", batch=1, seq=256)
    last, every = aisim.estimate(**kw), aisim.estimate(runtime="tgi-2023", **kw)
    head = 2 * 255 * 768 * 50272   # the extra logits rows of OPT-125m's LM head
    assert every.flops - last.flops == pytest.approx(head, rel=0.01)


def test_preallocated_kv_cache_writes_only_new_tokens():
    from aisim.formulas import kv_append_in_place

    old, new = TensorMeta((1, 12, 99, 64), "fp16"), TensorMeta((1, 12, 1, 64), "fp16")
    cat = Op(name="aten.cat", args=([old, new], -2), kwargs={}, outputs=(TensorMeta((1, 12, 100, 64), "fp16"),),
             alias=False, scope="model.decoder.layers.0.self_attn")
    assert op_cost(cat).bytes == pytest.approx(2 * 100 * 12 * 64 * 2)
    assert kv_append_in_place(op_cost(cat), cat).bytes == pytest.approx(2 * 12 * 64 * 2)
    other = Op(name="aten.cat", args=([old, new], -2), kwargs={}, outputs=cat.outputs, alias=False, scope="model")
    assert kv_append_in_place(op_cost(other), other) == op_cost(other)


def test_periodic_syncs_expose_the_cpu_each_repetition():
    # per "layer": a 10 us kernel dispatched in 1 us, then a sync costing 5 us of CPU; 4 layers
    gpu, cpu = np.array([10e-6, 0.0]), np.array([1e-6, 5e-6])
    t = simulate(gpu, cpu, np.array([4.0, 4.0]), np.array([False, True]))
    assert t.runtime_s == pytest.approx(4 * (1e-6 + 10e-6 + 5e-6))
    free = simulate(gpu, cpu, np.array([4.0, 4.0]), np.array([False, False]))
    assert free.runtime_s < t.runtime_s


def test_rope_concat_is_not_a_kv_append():
    from aisim.formulas import kv_append_in_place

    half = TensorMeta((1, 32, 100, 64), "fp16")
    rope = Op(name="aten.cat", args=([half, half], -1), kwargs={}, outputs=(TensorMeta((1, 32, 100, 128), "fp16"),),
              alias=False, scope="model.layers.0.self_attn")
    assert kv_append_in_place(op_cost(rope), rope) == op_cost(rope)


def test_vllm_writes_a_layers_k_and_v_in_one_kernel():
    """vLLM's reshape_and_cache_flash takes K and V together (kv_write_pair); StaticCache's index_copy_ writes
    each: the same bytes, half the kernels under vllm, every layer once."""
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    def writes(runtime, kv_dtype="auto"):
        sc = scenario("Meta-Llama-3-8B", "h100", dtype="bf16", runtime=runtime, kv_dtype=kv_dtype)
        a = op_arrays(sc, sc.workload(StepShape(phase="decode", batch=4, seq=512)))
        sel = [i for i, op in enumerate(a.ops) if op.name == "kv_cache.write"]
        return (float(sum(a.repeats[i] * a.launches[i] for i in sel)),
                sum(a.repeats[i] * op_cost(a.ops[i]).bytes for i in sel))

    (vllm_kernels, vllm_bytes), (graphs_kernels, graphs_bytes) = writes("vllm"), writes("graphs")
    assert (vllm_kernels, graphs_kernels) == (32, 64)
    assert vllm_bytes == pytest.approx(graphs_bytes) and vllm_bytes == pytest.approx(32 * 2 * 2 * (4 * 8 * 128 * 2))
    # --kv-dtype fp8: both tensors of the pair are stored in one byte (the write reads bf16 K/V once more: 3/4)
    assert writes("vllm", "fp8") == (32, pytest.approx(0.75 * vllm_bytes))


def test_prefill_writes_into_the_empty_cache_in_place():
    """At prefill HF's DynamicCache concatenates the new K/V onto an empty (0,) tensor: an engine with a
    preallocated cache writes them in place like any later step (vllm: one kernel per layer; graphs: two)."""
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    def counts(runtime):
        sc = scenario("Meta-Llama-3-8B", "h100", dtype="bf16", runtime=runtime)
        a = op_arrays(sc, sc.workload(StepShape(phase="prefill", batch=1, seq=512)))
        cats = sum(float(r) for op, r in zip(a.ops, a.repeats) if op.name == "aten.cat")
        writes = sum(float(r * n) for op, r, n in zip(a.ops, a.repeats, a.launches) if op.name == "kv_cache.write")
        return cats, writes

    assert counts("vllm") == (0, 32) and counts("graphs") == (0, 64)
    assert counts("eager")[1] == 0                      # HF's own cache: the concatenations stay


def test_vllm_runs_an_eager_attention_model_as_one_fused_kernel():
    """gpt-oss has no SDPA path in HF (attention sinks): its explicit Q K^T bmm, mask, sinks, softmax and P V bmm
    become vLLM's one FlashAttention kernel per layer (eager_attention), and the S x S scores leave the memory."""
    import aisim
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    def attention_ops(runtime, phase):
        sc = scenario("gpt-oss-20b", "h200", dtype="bf16", runtime=runtime)
        a = op_arrays(sc, sc.workload(StepShape(phase=phase, batch=1, seq=4096)))
        names = {}
        for op, r in zip(a.ops, a.repeats):
            if op.scope.endswith("self_attn") and op.name in ("attention.flash", "aten.bmm", "aten._softmax"):
                names[op.name] = names.get(op.name, 0) + float(r)
        return names

    assert attention_ops("vllm", "prefill") == {"attention.flash": 24}
    assert attention_ops("vllm", "decode") == {"attention.flash": 24}
    assert attention_ops("graphs", "prefill") == {"aten.bmm": 48, "aten._softmax": 24}     # HF compiled: explicit
    kw = dict(model="gpt-oss-20b", device="h200", workload="prefill", batch=1, seq=8192)
    eager, vllm = aisim.estimate(**kw), aisim.estimate(runtime="vllm", **kw)
    assert eager.memory.activations_gb > 20 and vllm.memory.activations_gb < 4        # 64 heads x 8192^2 scores
    assert vllm.runtime_ms < eager.runtime_ms / 3


def test_gpt_oss_shards_its_attention_sinks_under_tensor_parallelism():
    """gpt-oss's per-head sinks follow the heads over the tensor-parallel ranks (the trace used to fail at --tp 2)."""
    import aisim

    one = aisim.estimate(model="gpt-oss-20b", device="h100", workload="decode", batch=4, seq=1024, runtime="vllm")
    two = aisim.estimate(model="gpt-oss-20b", device="h100x2", tp=2, workload="decode", batch=4, seq=1024,
                         runtime="vllm")
    assert two.memory.weights_gb < 0.65 * one.memory.weights_gb and two.runtime_ms > 0
    assert any("all_reduce" in o.name for o in two.top_ops)


def test_gpt_oss_rotary_is_one_kernel_under_engines():
    """gpt-oss's rotary (first * cos - second * sin, second * cos + first * sin, a concatenation; no rotate_half
    negation) is one fused rotary kernel per layer under vllm and graphs, as rotate_half's form is."""
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    sc = scenario("gpt-oss-20b", "h200", dtype="bf16", runtime="vllm")
    a = op_arrays(sc, sc.workload(StepShape(phase="decode", batch=4, seq=1024)))
    attn = {}
    for op, r in zip(a.ops, a.repeats):
        if op.scope.endswith("self_attn") and op.name not in ("module.call",) and not op.attrs.get("view"):
            attn[op.name] = attn.get(op.name, 0) + float(r)
    assert attn == {"fused.rotary_embedding": 24, "kv_cache.write": 24, "attention.flash": 24}


def test_vllm_shards_the_lm_head_over_the_vocabulary():
    """vLLM's ParallelLMHead and VocabParallelEmbedding: under TP the vllm runtime shards the head and the input
    embedding over the vocabulary (tp scope full: a logits all-gather, an embedding all-reduce, half of each per
    GPU at TP 2) where eager HF keeps both whole."""
    kw = {"model": "Meta-Llama-3-8B", "device": "h100x2", "tp": 2, "workload": "decode", "batch": 8, "seq": 1024,
          "dtype": "bf16", "top_ops": None}
    vllm, eager = aisim.estimate(runtime="vllm", **kw), aisim.estimate(runtime="eager", **kw)
    assert vllm.plan.tp_scope == "full" and eager.plan.tp_scope == "all"
    assert "nccl.all_gather" in {r.name for r in vllm.top_ops}
    reduces = {r.name: r.count for r in vllm.top_ops}["nccl.all_reduce"]
    assert reduces == {r.name: r.count for r in eager.top_ops}["nccl.all_reduce"] + 1      # the embedding's
    head_bytes = 128256 * 4096 * 2 / 2       # half of the bf16 head, and half of the untied embedding, on each GPU
    assert eager.memory.weights_gb - vllm.memory.weights_gb == pytest.approx(2 * head_bytes / 1e9, rel=0.02)


def test_vllm_replicates_kv_heads_when_tp_exceeds_them():
    """Qwen3-30B-A3B has 4 KV heads: at tp 8 vLLM keeps one KV head per GPU, each on 2 GPUs
    (QKVParallelLinear num_kv_head_replicas); HF eager sharding cannot, and says which tp it can."""
    import aisim
    from aisim.errors import AisimError

    step = dict(workload="decode", batch=8, seq=1024, dtype="bf16", runtime="vllm")
    tp8 = aisim.estimate("Qwen3-30B-A3B", "h100x8", tp=8, **step)
    tp4 = aisim.estimate("Qwen3-30B-A3B", "h100x4", tp=4, **step)
    # one KV head per GPU either way: the same cache per GPU, 48 layers x 8 x 1024 tokens x K and V of 128 bf16
    assert tp8.memory.kv_cache_gb == pytest.approx(tp4.memory.kv_cache_gb, rel=1e-6)
    assert tp8.memory.kv_cache_gb == pytest.approx(48 * 8 * 1024 * 2 * 128 * 2 / 1e9, rel=0.02)
    # from tp 4 to tp 8 the weights halve but for what every GPU keeps whole: the k and v projections (one head
    # each, 48 x 2 x 2048 x 128), the routers (48 x 128 experts x 2048) and the norms (48 x 2 x 2048 + 2 x 128), bf16
    whole_gb = (48 * 2 * 2048 * 128 + 48 * 128 * 2048 + 48 * (2 * 2048 + 2 * 128)) * 2 / 1e9
    assert tp8.memory.weights_gb - tp4.memory.weights_gb / 2 == pytest.approx(whole_gb / 2, rel=0.02)
    assert any("one KV head" in n for n in tp8.assumptions)
    with pytest.raises(AisimError, match="divisors of 4"):
        aisim.estimate("Qwen3-30B-A3B", "h100x8", tp=8, workload="decode", batch=8, seq=1024, dtype="bf16")
    from aisim.plan import check_tp

    config = {"num_attention_heads": 24, "num_key_value_heads": 8, "hidden_size": 3072, "intermediate_size": 8208}
    assert check_tp(config, 24, "all", replicate_kv=True) == 3
    with pytest.raises(AisimError, match="divisors or the multiples of 8"):
        check_tp(config, 12, "all", replicate_kv=True)


def test_fp8_decode_streams_half_the_bytes_and_grows_with_the_batch():
    """W8A8 fp8 decode reads half the weight bytes: faster than bf16 at batch 1 (it was slower, the fp8 FLOPs curve
    starting at M = 16), and the step time does not fall as the batch grows (fp8-memory curve over bytes from
    validation/data/kernels/fp8-gemm-smallm-h100.jsonl)."""
    from aisim import estimate

    kw = dict(workload="decode", seq=1024, dtype="bf16", runtime="vllm")
    bf16 = estimate("Meta-Llama-3-8B", "h100", batch=1, **kw).runtime_ms
    fp8 = [estimate("Meta-Llama-3-8B", "h100", batch=b, quant="fp8", **kw).runtime_ms for b in (1, 2, 4, 8, 16, 32)]
    assert fp8[0] < 0.75 * bf16
    assert all(a <= b for a, b in zip(fp8, fp8[1:]))


def test_vllm_refuses_bf16_and_fp8_below_compute_capability_8():
    """vLLM refuses bf16 below compute capability 8.0 (its worker's dtype check) and fp8 (Fp8Config minimum 80):
    a T4 or V100 plan says so in one line instead of costing it at the fp16 rate."""
    from aisim import estimate
    from aisim.errors import AisimError

    kw = dict(workload="decode", seq=1024, runtime="vllm")
    with pytest.raises(AisimError, match="bf16 on compute capability 8.0"):
        estimate("Meta-Llama-3-8B", "t4", dtype="bf16", **kw)
    with pytest.raises(AisimError, match="fp8 on compute capability 8.0"):
        estimate("Meta-Llama-3-8B", "v100-sxm2-32gb", dtype="fp16", quant="fp8", **kw)
    assert estimate("Meta-Llama-3-8B", "a100", dtype="bf16", quant="fp8", **kw).runtime_ms > 0
    assert estimate("opt-1.3b", "t4", dtype="fp16", **kw).runtime_ms > 0
    # gpt-oss's experts are stored MXFP4: Mxfp4Config.get_min_capability 80 (vllm/model_executor/layers/
    # quantization/mxfp4.py); transformers (eager) loads them on a T4, and training re-reads no checkpoint quant
    with pytest.raises(AisimError, match="mxfp4 on compute capability 8.0.*no MXFP4 quantization_config"):
        estimate("gpt-oss-20b", "t4", dtype="fp16", **kw)
    with pytest.raises(AisimError, match="mxfp4 on compute capability 8.0"):   # the experts stay MXFP4 under --quant
        estimate("gpt-oss-20b", "t4", dtype="fp16", quant="int8", **kw)
    assert estimate("gpt-oss-20b", "a100", dtype="bf16", **kw).runtime_ms > 0
    assert estimate("gpt-oss-20b", "t4", dtype="fp16", workload="decode", seq=1024).runtime_ms > 0


def test_capability_refusals_come_together_and_unusual_capability_strings_pass():
    from aisim.errors import AisimError
    from aisim.scenario import _capability, _check_capability
    from aisim.specs import all_hardware, all_runtimes

    vllm, t4 = all_runtimes()["vllm"], all_hardware()["t4"]
    with pytest.raises(AisimError, match="bf16 .* and fp8 .*--dtype fp16 and --quant"):
        _check_capability(vllm, t4, "bf16", "fp8")
    assert _capability("9.0a") == (9, 0) and _capability("gfx942") is None
    _check_capability(vllm, t4.model_copy(update={"compute_capability": "sm_75"}), "bf16", "none")   # not checked
    _check_capability(all_runtimes()["eager"], t4, "bf16", "fp8")                                  # no minimum


def test_fp8_decode_on_the_h200_streams_too():
    """h200.yaml has GEMM tables but no fp8 curve: a memory-bound fp8 GEMM takes the default rules' memory-bound
    GEMM curve over bytes (it took the fp16 FLOPs curve: batch 1 slower than bf16 and than batch 2)."""
    from aisim import estimate

    kw = dict(workload="decode", seq=1024, dtype="bf16", runtime="vllm")
    bf16 = estimate("Meta-Llama-3-8B", "h200", batch=1, **kw).runtime_ms
    fp8 = [estimate("Meta-Llama-3-8B", "h200", batch=b, quant="fp8", **kw).runtime_ms for b in (1, 2, 4, 8, 16, 32)]
    assert fp8[0] < 0.75 * bf16 and all(a <= b for a, b in zip(fp8, fp8[1:]))


def test_windowed_causal_pairs_match_counting_them():
    from hypothesis import given, settings, strategies as st

    from aisim.formulas import attention_pairs

    @settings(max_examples=200, deadline=None)
    @given(st.integers(1, 300), st.integers(0, 300), st.one_of(st.none(), st.integers(1, 400)))
    def check(sq, extra, window):
        skv = sq + extra
        q, k = TensorMeta((1, 1, sq, 8), "bf16"), TensorMeta((1, 1, skv, 8), "bf16")
        counted = sum(min(skv - sq + i + 1, window or skv) for i in range(sq))
        assert attention_pairs(q, k, True, window) == counted

    check()


def test_engine_sliding_window_prefill_runs_the_band_and_decode_copies_no_kv_heads():
    """Mistral-7B (window 4096) under vllm: from 4096 tokens transformers traces a masked kernel over every pair and
    repeat_kv copies (the mask rules out SDPA's GQA); vLLM's FlashAttention takes the window and reads the KV heads.
    Prefill at 4096 costs the causal triangle (Llama-3-8B's attention FLOPs at the same length), at 8192 the band
    (8192 x 4096 - 4096 x 4095 / 2 pairs per head, not 8192 x 4096); decode activations at 4096 are not the 4x
    copied K and V of a layer (1.07 GB at batch 16)."""
    from aisim.scenario import scenario
    from aisim.step import step_cost
    from aisim.workload import StepShape

    def attention(model, phase, batch, seq):
        cost = step_cost(scenario(model, "h100", dtype="bf16", runtime="vllm"),
                         StepShape(phase=phase, batch=batch, seq=seq))
        rows = [r for r in cost.table if r.name.startswith("attention")]
        return rows, cost

    rows, _ = attention("Mistral-7B-v0.1", "prefill", 1, 4096)
    llama, _ = attention("Meta-Llama-3-8B", "prefill", 1, 4096)
    assert [r.name for r in rows] == ["attention.flash"] and rows[0].flops == pytest.approx(llama[0].flops)
    rows, _ = attention("Mistral-7B-v0.1", "prefill", 1, 8192)
    band = 8192 * 4096 - 4096 * 4095 / 2
    assert rows[0].flops == pytest.approx(4 * 32 * 32 * 128 * band, rel=1e-6)
    rows, cost = attention("Mistral-7B-v0.1", "decode", 16, 4096)
    assert [r.name for r in rows] == ["attention.flash"] and cost.memory.activations_gb < 0.5


def test_dropped_repeat_kv_copies_leave_the_peak_once_and_only_under_an_engine_with_native_gqa():
    """The copies' bytes are counted once (the clone allocates; the reshape after it does not) and taken off the ops
    between them and their release, the fused eager attention of gpt-oss included; HF's compiled runtime (graphs)
    keeps transformers' masked kernel for a window, as it runs it."""
    from aisim.scenario import scenario
    from aisim.step import op_arrays, step_cost
    from aisim.workload import StepShape

    sc = scenario("Mistral-7B-v0.1", "h100", dtype="bf16", runtime="vllm")
    ops = op_arrays(sc, sc.workload(StepShape(phase="decode", batch=16, seq=4096))).ops
    attn = [o for o in ops if o.name == "attention.flash"]
    assert attn and all(o.attrs["live_bytes"] > 0.5e9 for o in attn)   # the layer's activations, not clamped to 0
    for model, shape in (("gpt-oss-20b", StepShape(phase="prefill", batch=1, seq=4096)),
                         ("Mistral-7B-v0.1", StepShape(phase="decode", batch=16, seq=4096))):
        engine = step_cost(scenario(model, "h100", dtype="bf16", runtime="vllm"), shape).memory.activations_gb
        hf = step_cost(scenario(model, "h100", dtype="bf16", runtime="eager"), shape).memory.activations_gb
        assert engine < hf, model
    graphs = step_cost(scenario("Mistral-7B-v0.1", "h100", dtype="bf16", runtime="graphs"),
                       StepShape(phase="prefill", batch=1, seq=8192))
    assert [r.name for r in graphs.table if r.name.startswith("attention")] == ["attention.efficient"]
