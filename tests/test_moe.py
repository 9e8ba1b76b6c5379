"""MoE routing, expert parallelism, engine profiles (vllm, graphs), fp8 and the MoE accuracy ceilings.

Exact numbers are worked in the comments; the MAPE ceilings follow tests/test_accuracy_ceilings.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from aisim.formulas import Cost, expected_distinct_experts, op_cost
from aisim.graph.ops import Op, TensorMeta


def test_expected_distinct_experts_hand_worked():
    # one token picks exactly k experts
    assert expected_distinct_experts(1, 8, 64) == pytest.approx(8.0)
    # 8 tokens, top-8 of 64: 64 * (1 - (56/64)^8) = 64 * (1 - 0.343609) = 42.009
    assert expected_distinct_experts(8, 8, 64) == pytest.approx(42.009, abs=1e-3)
    # many tokens touch every expert
    assert expected_distinct_experts(100_000, 2, 8) == pytest.approx(8.0)
    assert expected_distinct_experts(0, 2, 8) == 0.0


def _grouped(rows: int, experts: int, k: int, n: int, moe: dict | None) -> Op:
    a, w = TensorMeta((rows, k), "bf16"), TensorMeta((experts, k, n), "bf16")
    offs = TensorMeta((experts,), "int32")
    return Op("aten._grouped_mm", (a, w, offs), {}, (TensorMeta((rows, n), "bf16"),), False,
              attrs={} if moe is None else {"moe": moe})


def test_grouped_mm_reads_only_touched_experts():
    # decode of 1 token, top-2 of 8 (Mixtral): S = 2 rows; 2 experts of K x N = 4096 x 1024 bf16 read
    op = _grouped(2, 8, 4096, 1024, {"experts": 8, "top_k": 2, "token_groups": 1})
    c = op_cost(op)
    expert = 4096 * 1024 * 2
    # 2 experts + rows in (2 x 4096 x 2 B) + offsets (8 x 4 B); out 2 x 1024 x 2 B; FLOPs 2 * 2 * 1024 * 4096
    assert c == Cost(2.0 * 2 * 1024 * 4096, 2 * expert + 2 * 4096 * 2 + 32, 2 * 1024 * 2, 1, "gemm")
    unrouted = op_cost(_grouped(2, 8, 4096, 1024, None))
    assert unrouted.bytes_read == 8 * expert + 2 * 4096 * 2 + 32      # untagged: every expert


def test_expert_parallel_halves_local_rows_and_experts():
    # ep 2: 4 local experts of 8; 8 tokens x top-2 = 16 rows, this GPU computes 16 * 4/8 = 8 of them
    op = _grouped(16, 4, 4096, 1024, {"experts": 8, "top_k": 2, "token_groups": 1})
    c = op_cost(op)
    assert c.flops == 2.0 * 8 * 1024 * 4096
    touched = 4 * (1 - (1 - 2 / 8) ** 8)                                # 4 * (1 - 0.75^8) = 3.5995
    assert c.bytes_read == pytest.approx(touched * 4096 * 1024 * 2 + 8 * 4096 * 2 + 16)


def _estimate(**kw):
    from aisim.api import estimate

    return estimate(**{"dtype": "bf16", "top_ops": None, **kw})


def test_mixtral_fits_two_h100_with_tp_or_ep():
    for plan in ({"tp": 2}, {"ep": 2}):
        est = _estimate(model="Mixtral-8x7B-v0.1", device="h100x2", workload="decode", batch=8, seq=2048, **plan)
        assert est.fits, plan
        assert 46.0 < est.memory.weights_gb < 48.0                       # 46.7e9 params x 2 B / 2 GPUs
    one = _estimate(model="Mixtral-8x7B-v0.1", device="h200", workload="decode", batch=1, seq=1024)
    assert 24e9 < one.bytes < 28e9                                       # 2 of 8 experts per layer, not 90 GB


def test_a_norm_over_all_heads_gathers_q_and_k_under_tensor_parallelism():
    """OLMoE's q_norm / k_norm normalise all heads together (RMSNorm(hidden)): each rank all-gathers its shard
    first (vLLM OlmoeAttention._apply_qk_norm); tracing it with tp 2 used to fail on the shape. Qwen3's per-head
    norms shard without a gather."""
    est = _estimate(model="OLMoE-1B-7B-0924", device="h100x2", workload="decode", batch=8, seq=1024, tp=2,
                    runtime="vllm", top_ops=100)
    ops = {o.name: o for o in est.top_ops}
    assert ops["nccl.all_gather"].count == 2 * 16 + 1        # q and k per layer, and the vocab-parallel LM head
    # one decode token of batch 8: q and k (16 heads x 128 = 2048 wide, bf16) are gathered from 1024-wide halves
    per_layer_out = 2 * (8 * 2048 * 2)
    assert ops["nccl.all_gather"].bytes >= 16 * per_layer_out
    qwen = _estimate(model="Qwen3-30B-A3B", device="h100x2", workload="decode", batch=8, seq=1024, tp=2,
                     runtime="vllm", top_ops=100)
    assert [o.count for o in qwen.top_ops if o.name == "nccl.all_gather"] == [1]   # the LM head only
    # training: the gathers' backward is a reduce-scatter, and the MoE block's input gradient is all-reduced as
    # an MLP's (Megatron's f): 4 all-reduces per layer, as a dense model's; the vocab-parallel embedding's output,
    # the LM head's input gradient and the vocab-parallel loss's three add 5
    train = _estimate(model="OLMoE-1B-7B-0924", device="h100x2", workload="train", batch=2, seq=256, tp=2,
                      top_ops=200)
    comm = {o.name: o for o in train.top_ops if o.name.startswith("nccl")}
    assert {k: o.count for k, o in comm.items()} == {"nccl.all_reduce": 4 * 16 + 5, "nccl.all_gather": 2 * 16,
                                                     "nccl.reduce_scatter": 2 * 16}
    # a reduce-scatter moves the full gradient it reduces (it was costed at one shard: 1/tp of it)
    assert comm["nccl.reduce_scatter"].bytes == pytest.approx(comm["nccl.all_gather"].bytes)
    # a shared expert inside the MoE block shares its backward all-reduce (Qwen1.5-MoE: one per block, as
    # Megatron at the MoE layer's input; the forward keeps HF's two row-parallel outputs: 5 per layer, not 6)
    qwen_train = _estimate(model="Qwen1.5-MoE-A2.7B", device="h100x2", workload="train", batch=2, seq=256, tp=2,
                           top_ops=200)
    assert [o.count for o in qwen_train.top_ops if o.name == "nccl.all_reduce"] == [5 * 24 + 5]


def test_expert_parallelism_computes_this_gpus_share_of_the_routed_rows():
    """--ep 2 over the tp 2 GPUs: each GPU's grouped GEMMs run half the experts on the rows routed to them, the same
    GEMM work per GPU as splitting every expert over both; backward's weight-gradient grouped GEMM ran over every
    routed row (twice the work). The experts' other kernels run over every routed row with ep <= tp, as vLLM's
    TritonExperts and transformers' grouped_mm path do (each GPU holds every token): vLLM's moe_act over the full
    intermediate is twice tp 2's. Across data-parallel ranks (ep 2 > tp 1 on 2 GPUs) the all-to-all brings a GPU
    its experts' rows only."""
    def work(workload, ep, runtime=None, tp=2):
        est = _estimate(model="OLMoE-1B-7B-0924", device="h100x2", workload=workload, batch=8, seq=512, tp=tp, ep=ep,
                        runtime=runtime, top_ops=300)
        return {o.name: o.flops for o in est.top_ops if o.name in ("aten._grouped_mm", "fused.moe_act")}
    tp, ep = work("prefill", 1, "vllm"), work("prefill", 2, "vllm")
    assert ep["aten._grouped_mm"] == pytest.approx(tp["aten._grouped_mm"])
    assert ep["fused.moe_act"] == pytest.approx(2 * tp["fused.moe_act"])
    assert work("train", 2)["aten._grouped_mm"] == pytest.approx(work("train", 1)["aten._grouped_mm"])
    dp = work("prefill", 2, "vllm", tp=1)           # 2 ranks of tp 1, 4 sequences each, experts split by ep
    one = _estimate(model="OLMoE-1B-7B-0924", device="h100", workload="prefill", batch=4, seq=512, runtime="vllm",
                    top_ops=300)
    assert dp["fused.moe_act"] == pytest.approx(next(o.flops for o in one.top_ops if o.name == "fused.moe_act"))


def test_vllm_all_reduces_a_shared_expert_with_the_routed_experts_once():
    """Qwen1.5-MoE under tp 2: HF's modules all-reduce the shared expert's down_proj and the experts' output apart
    (3 per layer with attention's o_proj); vLLM builds both with reduce_results=False and all-reduces their sum
    once (2 per layer; its vocab-parallel embedding adds one)."""
    counts = {}
    for runtime in ("vllm", "eager"):
        est = _estimate(model="Qwen1.5-MoE-A2.7B", device="h100x2", workload="decode", batch=8, seq=1024, tp=2,
                        runtime=runtime, top_ops=300)
        counts[runtime] = next(o.count for o in est.top_ops if o.name == "nccl.all_reduce")
    assert counts == {"vllm": 2 * 24 + 1, "eager": 3 * 24}


@pytest.mark.parametrize("runtime", ["vllm", "graphs"])
def test_engines_write_the_kv_cache_in_place(runtime):
    est = _estimate(model="Meta-Llama-3-8B", device="h100", workload="decode", batch=32, seq=7512, runtime=runtime)
    names = {r.name for r in est.top_ops}
    assert "aten.cat" not in names and "kv_cache.write" in names
    assert {"fused.add_rms_norm", "fused.silu_and_mul", "fused.rotary_embedding"} <= names
    if runtime == "vllm":   # graphs: HF's static cache repeats the KV heads over the whole cache (below)
        eager = _estimate(model="Meta-Llama-3-8B", device="h100", workload="decode", batch=32, seq=7512)
        assert est.runtime_ms < 0.5 * eager.runtime_ms


def test_block_scaled_fp8_checkpoint_quantizes_each_activation_in_one_kernel(tmp_path):
    """A checkpoint with 128 x 128 weight blocks (DeepSeek-V3's quantization_config) runs vLLM's per-token-group
    activation quantization, one kernel; a 16-bit checkpoint with --quant fp8 the per-tensor one, two kernels."""
    import json
    from pathlib import Path

    config = json.loads(Path("model_specs/Meta-Llama-3-8B.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    kw = {"device": "h100", "workload": "decode", "batch": 8, "seq": 1024, "runtime": "vllm"}
    block = _estimate(model=str(tmp_path / "config.json"), **kw)
    tensor = _estimate(model="Meta-Llama-3-8B", quant="fp8", **kw)
    b, t = ({r.name: r for r in e.top_ops}["fp8.quantize"] for e in (block, tensor))
    assert b.count == t.count and b.bytes == pytest.approx(t.bytes) and b.time_ms < t.time_ms
    assert block.runtime_ms < tensor.runtime_ms
    assert any("per-token-group" in a for a in block.assumptions)
    assert any("per-tensor" in a for a in tensor.assumptions)


def test_vllm_runs_qkv_and_gate_up_as_one_gemm_each():
    """vLLM's QKVParallelLinear and MergedColumnParallelLinear: 4 projection GEMMs per Llama layer, not 7, over the
    same weight bytes; HF's eager and graphs runtimes keep the 7 separate linears."""
    kw = {"model": "Meta-Llama-3-8B", "device": "h100", "workload": "decode", "batch": 8, "seq": 1024}
    vllm = {r.name: r for r in _estimate(runtime="vllm", **kw).top_ops}
    eager = {r.name: r for r in _estimate(**kw).top_ops}
    assert eager["aten.mm"].count == 7 * 32 + 1 and vllm["aten.mm"].count == 4 * 32 + 1
    assert vllm["aten.mm"].flops == pytest.approx(eager["aten.mm"].flops)
    assert vllm["aten.mm"].bytes < eager["aten.mm"].bytes            # the activations are read once per merged GEMM
    assert vllm["aten.mm"].bytes > 0.99 * eager["aten.mm"].bytes     # the weights dominate and are all still read
    fp8 = {r.name: r for r in _estimate(runtime="vllm", quant="fp8", **kw).top_ops}
    assert fp8["aten.mm"].count == 4 * 32 + 1 and fp8["fp8.quantize"].count == 4 * 32   # one per merged GEMM
    opt = {r.name: r for r in _estimate(model="opt-1.3b", device="h100", workload="decode", batch=8, seq=512,
                                        runtime="vllm", dtype="fp16").top_ops}
    assert opt["aten.addmm"].count == 4 * 24                         # qkv (biased), out_proj, fc1, fc2
    # fp8 W8A8 biased GEMMs read their fp8 weights (the bias operand is not the weight's width)
    kw8 = {"model": "opt-1.3b", "device": "h100", "workload": "decode", "batch": 1, "seq": 512, "runtime": "vllm"}
    fp8_opt = {r.name: r for r in _estimate(dtype="fp16", quant="fp8", **kw8).top_ops}["aten.addmm"]
    fp16_opt = {r.name: r for r in _estimate(dtype="fp16", **kw8).top_ops}["aten.addmm"]
    assert fp8_opt.bytes == pytest.approx(fp16_opt.bytes / 2, rel=0.02)
    # whisper: q and v have biases, k has none; the merged GEMM keeps the bias (vLLM zero-fills k's)
    wh = {r.name: r for r in _estimate(model="whisper-medium.en", device="h100", workload="decode", batch=1,
                                        seq=64, runtime="vllm", dtype="fp16").top_ops}
    assert "aten.addmm" in wh


def _graphs_rows(**kw):
    est = _estimate(model="Meta-Llama-3-8B", device="h100", workload="decode", runtime="graphs", **kw)
    return est, {r.name: r for r in est.top_ops}


def test_graphs_static_cache_repeats_kv_heads_over_max_cache_len():
    """transformers 5.17 StaticCache decode: K/V are the whole (B, 8, L, 128) buffers, a mask is passed, so
    repeat_kv copies them to 32 heads (integrations/sdpa_attention.py l. 97-100) and SDPA runs the masked kernel
    over L keys of all 32 heads."""
    est, rows = _graphs_rows(batch=32, seq=1024, static_cache_len=1039)
    kv = 32 * 8 * 1039 * 128 * 2                        # one layer's K (or V) cache: 68,091,904 B
    rep = rows["repeat_kv.copy"]
    assert rep.count == 2 * 32                          # K and V, 32 layers
    assert rep.bytes == pytest.approx(2 * 32 * (kv + 4 * kv))     # read 8 heads, write 32 heads
    attn = rows["attention.efficient"]
    q_out = 2 * 32 * 32 * 128 * 2                      # q and the output, (32, 32, 1, 128) bf16 each
    mask = 32 * 1039 * 2                                # (32, 1, 1, 1039) bf16
    assert attn.bytes == pytest.approx(32 * (2 * 4 * kv + q_out + mask))
    assert "attention.flash" not in rows and "aten.cat" not in rows


def test_graphs_static_cache_len_scales_attention_not_weights():
    _, short = _graphs_rows(batch=1, seq=1024, static_cache_len=1039)
    _, long = _graphs_rows(batch=1, seq=1024, static_cache_len=4096)
    for name in ("repeat_kv.copy", "attention.efficient"):
        assert long[name].bytes / short[name].bytes == pytest.approx(4096 / 1039, rel=0.01)
    assert long["aten.mm"].bytes == short["aten.mm"].bytes
    est, _ = _graphs_rows(batch=1, seq=1024)            # default: the context (the cache full at its end)
    assert est.runtime_ms == pytest.approx(_graphs_rows(batch=1, seq=1024, static_cache_len=1024)[0].runtime_ms)


def test_graphs_generate_sizes_the_static_cache_as_hf_generate():
    # HF generate: max_cache_len = prompt + max_new_tokens; every decode step attends over all of it
    kw = {"model": "Meta-Llama-3-8B", "device": "h100", "workload": "generate", "batch": 1, "seq": 1024, "gen": 64,
          "runtime": "graphs"}
    assert _estimate(**kw).runtime_ms == pytest.approx(_estimate(static_cache_len=1088, **kw).runtime_ms)
    assert _estimate(static_cache_len=8192, **kw).runtime_ms > _estimate(**kw).runtime_ms
    # the static cache exists from the prefill on: the peak is the prefill's activations beside the whole cache
    big = _estimate(static_cache_len=8192, **{**kw, "batch": 8})
    prefill = _estimate(**{**{k: v for k, v in kw.items() if k != "gen"}, "workload": "prefill", "batch": 8})
    assert big.memory.kv_cache_gb == pytest.approx(8 * 8192 * 32 * 2 * 8 * 128 * 2 / 1e9, rel=0.01)
    assert big.memory.total_gb == pytest.approx(
        prefill.memory.total_gb - prefill.memory.kv_cache_gb + big.memory.kv_cache_gb, rel=1e-6)


def test_static_cache_len_is_refused_where_it_means_nothing():
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="static-cache runtime"):
        _estimate(model="Meta-Llama-3-8B", device="h100", workload="decode", seq=1024, runtime="vllm",
                  static_cache_len=4096)
    with pytest.raises(AisimError, match="shorter than the longest context"):
        _estimate(model="Meta-Llama-3-8B", device="h100", workload="decode", seq=1024, runtime="graphs",
                  static_cache_len=512)
    with pytest.raises(AisimError, match="applies to --workload decode or generate only"):
        _estimate(model="Meta-Llama-3-8B", device="h100", workload="prefill", seq=1024, runtime="graphs",
                  static_cache_len=4096)


def test_graphs_decode_stays_under_its_ceiling():
    from aisim.validation import moe_report

    rows = moe_report.compare_graphs()
    assert len(rows) == 4
    assert moe_report.graphs_mape(rows) <= moe_report.GRAPHS_CEILING
    every = rows + moe_report.compare_graphs(moe_report.GRAPHS_CACHELEN_DATA) \
        + moe_report.compare_graphs(moe_report.GRAPHS_B8_DATA) + moe_report.compare_graphs(moe_report.GRAPHS_FRESH_DATA)
    oos = {gpu: [r for path in files for r in moe_report.compare_graphs(path)]
           for gpu, files in moe_report.GRAPHS_OOS_DATA.items()}
    every += oos["h100"] + oos["h200"]
    assert len(every) == 32 and {1, 8, 32} <= {r.batch for r in every}      # the batches the engines issue names
    assert moe_report.graphs_mape(every) <= moe_report.GRAPHS_ALL_CEILING
    # the H200 rows are priced on the H200 (the file's GPU), and every out-of-sample row had a prediction
    llama = {gpu: next(r for r in rows if r.model == "Meta-Llama-3-8B" and r.batch == 24) for gpu, rows in oos.items()}
    assert llama["h200"].estimated_ms < 0.85 * llama["h100"].estimated_ms     # 4.8 against 3.35 TB/s
    for gpu, rows in oos.items():
        assert {(r.model, r.batch, r.cache_len) for r in rows} == set(moe_report.GRAPHS_OOS_PREDICTED_MS[gpu])


def test_fp8_prefill_runs_at_the_fp8_rate_on_h100_and_falls_back_on_a100():
    kw = {"model": "Meta-Llama-3-8B", "workload": "prefill", "batch": 8, "seq": 2048}
    bf16 = _estimate(device="h100", **kw)
    fp8 = _estimate(device="h100", quant="fp8", **kw)
    mm = {e: next(r for r in x.top_ops if r.name == "aten.mm") for e, x in (("bf16", bf16), ("fp8", fp8))}
    rate = {e: r.flops / r.time_ms / 1e9 for e, r in mm.items()}          # TFLOP/s
    assert rate["fp8"] > 1.7 * rate["bf16"] and rate["fp8"] > 1100        # microbenchmark: 0.56-0.66 of 1979
    a100 = _estimate(device="a100", quant="fp8", **kw)
    assert any("no fp8 tensor cores" in n for n in a100.assumptions)
    assert "fp8.quantize" not in {r.name for r in a100.top_ops}


def test_moe_dataset_stays_under_its_ceilings():
    from aisim.validation import moe_report

    mape = moe_report.moe_mape(moe_report.compare_moe())
    assert set(mape) == set(moe_report.CEILINGS)
    over = {k: round(v, 2) for k, v in mape.items() if v > moe_report.CEILINGS[k]}
    assert over == {}
    assert len(moe_report.median_rows()) == 36      # every case, each over the runs that measured it


def test_graphs_harness_static_cache_survives_more_steps_than_its_position_span():
    """validation/harness/graphs_decode.py: transformers 5.x StaticLayer writes at its own fill level, so the
    harness rewinds it each step (the H100 run crashed with index_copy_ out of bounds after 16 steps)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from aisim.validation.harness.graphs_decode import POSITION_SPAN, Decoder

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    model = transformers.LlamaForCausalLM(cfg).eval()
    decoder = Decoder(model, 2, 32, torch.device("cpu"), 0)
    for _ in range(3 * POSITION_SPAN + 2):
        decoder.step()
    # the last step rewound to 31 + (3 * 16 + 1) % 16 = 32 and wrote one token
    assert [int(layer.cumulative_length) for layer in decoder.cache.layers] == [33, 33]


def test_fp8_kv_cache_halves_kv_memory_and_attention_reads():
    kw = {"model": "Meta-Llama-3-8B", "device": "h100", "workload": "decode", "batch": 8, "seq": 4096,
          "runtime": "vllm"}
    bf16, fp8 = _estimate(**kw), _estimate(kv_dtype="fp8", **kw)
    assert fp8.memory.kv_cache_gb == pytest.approx(bf16.memory.kv_cache_gb / 2)
    attn = {k: next(r for r in e.top_ops if r.name.startswith("attention")) for k, e in (("bf16", bf16), ("fp8", fp8))}
    assert attn["fp8"].bytes < 0.55 * attn["bf16"].bytes


def test_expert_parallel_over_data_parallel_ranks_uses_all_to_all():
    est = _estimate(model="Mixtral-8x7B-v0.1", device="h100x2", workload="decode", batch=8, seq=1024, tp=1, dp=2,
                    ep=2)
    rows = {r.name: r for r in est.top_ops}
    assert rows["nccl.all_to_all"].count == 2 * 32                      # dispatch and combine per MoE layer
    assert "nccl.all_reduce" not in rows


def test_masked_attention_efficiency_hand_worked():
    """The H100 sdpa_mask table (q=1 row: 0.157 at 1024 keys, 0.4263 at 4096, best 0.8576 at 65536; 32 heads,
    batch 1 = 32 thread blocks on 132 SMs) rescaled by occupancy and capped at the row's best."""
    from aisim.catalog import resolve_device
    from aisim.cost.efficiency import masked_attention_efficiency
    from aisim.specs import load_calibration

    gpu = resolve_device("h100").gpu
    cal = load_calibration("h100-sxm")
    assert masked_attention_efficiency(cal, gpu, 1, 1024, 32) == pytest.approx(0.157)
    assert masked_attention_efficiency(cal, gpu, 1, 1024, 12) == pytest.approx(0.157 * 12 / 32)
    # 1024 blocks fill the 132 SMs: 0.157 / (32 / 132) = 0.6476
    assert masked_attention_efficiency(cal, gpu, 1, 1024, 1024) == pytest.approx(0.157 * 132 / 32)
    # 0.4263 * 132 / 32 = 1.76 > the row's best: capped at 0.8576
    assert masked_attention_efficiency(cal, gpu, 1, 4096, 1024) == pytest.approx(0.8576)


def test_moe_in_fp16_is_costed_with_a_note():
    """torch._grouped_mm takes bf16 only; fp16 MoE (as engines serve it) is traced through bf16 and costed in fp16."""
    est = _estimate(model="Mixtral-8x7B-v0.1", device="h100x2", workload="decode", batch=8, seq=2048, tp=2,
                    dtype="fp16")
    bf16 = _estimate(model="Mixtral-8x7B-v0.1", device="h100x2", workload="decode", batch=8, seq=2048, tp=2)
    assert est.fits and est.memory.weights_gb == pytest.approx(bf16.memory.weights_gb)
    assert est.bytes == pytest.approx(bf16.bytes, rel=0.01)
    assert any("MoE in fp16" in n for n in est.assumptions)


def test_graphs_harness_cache_len_option():
    """graphs_decode --cache-lens: a static cache longer than the decode positions need is fine; shorter is refused."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from aisim.validation.harness.graphs_decode import Decoder, default_cache_len

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    model = transformers.LlamaForCausalLM(cfg).eval()
    decoder = Decoder(model, 1, 32, torch.device("cpu"), 0, max_cache_len=64)
    decoder.step()
    assert decoder.cache.layers[0].keys.shape[2] == 64 and default_cache_len(32) == 47
    with pytest.raises(ValueError, match="write past the cache"):
        Decoder(model, 1, 32, torch.device("cpu"), 0, max_cache_len=40)


def test_graphs_static_cache_of_a_sliding_window_model_past_its_window():
    """Mistral's windowed layers hold min(max_cache_len, window) static slots, and past the window the decode
    attention is still the static-cache one (the rewrite used to skip layers whose traced keys were the window)."""
    kw = dict(model="mistral-7b", device="h100", workload="decode", batch=16, runtime="graphs", static_cache_len=16384,
              top_ops=40)
    inside, past = _estimate(seq=4000, **kw), _estimate(seq=4097, **kw)
    kv_4096_slots = 32 * 2 * 8 * 128 * 4096 * 2 * 16 / 1e9          # layers x K,V x kv heads x dim x slots x B x batch
    for est in (inside, past):
        assert est.memory.kv_cache_gb == pytest.approx(kv_4096_slots, rel=0.02)
        assert any(r.name == "static_cache.fill_level" for r in est.top_ops)
        assert not any(r.name == "aten.clone" for r in est.top_ops)   # the traced repeat_kv became repeat_kv.copy
    assert past.runtime_ms == pytest.approx(inside.runtime_ms, rel=0.01)   # both hold the same 4096 slots


def test_moe_run_to_run_floor_and_aisim_against_it():
    """The MoE runs' spread (validation/moe_report.run_to_run): every ordered pair of the 9 runs; one run's decode
    times estimate another's worse than aisim estimates a run (mean per-run MAPE), the gate that host variance sets."""
    import statistics

    from aisim.validation import moe_report

    per_run = moe_report.runs_rows()
    floor = moe_report.run_to_run(per_run)
    n = len(per_run)
    assert n == len(moe_report.RUNS) == 9 and floor["decode"]["pairs"] == n * (n - 1)
    assert 5.0 < floor["decode"]["others_mean"] < floor["decode"]["mean"] < 40.0
    aisim_decode = statistics.mean(moe_report.moe_mape(rows)["decode runtime"] for rows in per_run.values())
    assert aisim_decode < floor["decode"]["mean"]


def test_mxfp4_experts_are_named_and_stay_mxfp4_under_quant_fp8():
    """gpt-oss ships MXFP4 experts: a note says so with or without --quant, and --quant fp8 does not claim fp8
    experts (the memory keeps them at 4.25 bits)."""
    plain = _estimate(model="gpt-oss-20b", device="h200", workload="decode", runtime="vllm")
    fp8 = _estimate(model="gpt-oss-20b", device="h200", workload="decode", runtime="vllm", quant="fp8")
    for e in (plain, fp8):
        assert any("MXFP4 as the checkpoint stores them" in n for n in e.assumptions)
    assert not any("expert weights stored fp8" in n for n in fp8.assumptions)
    assert plain.memory.weights_gb - fp8.memory.weights_gb < 1.0        # only the non-expert linears shrink
    assert not any("MoE experts fp8 x fp8" in n for n in fp8.assumptions)
    dense = _estimate(model="Mixtral-8x7B-v0.1", device="h200", workload="decode", runtime="vllm", quant="fp8")
    assert any("MoE experts fp8 x fp8" in n for n in dense.assumptions)


def test_gpt_oss_decode_at_one_kv_head_per_gpu_is_one_fused_attention_over_the_kv_heads():
    """gpt-oss-20b (64 query heads, 8 KV heads, HF's explicit attention with sinks) under vllm: at tp 8 each GPU has
    one KV head, repeat_kv's expand needs no copy and torch.matmul copies the broadcast K^T itself; that chain is
    still vLLM's one attention kernel over the KV heads (it was HF's clones and bmms over 8 repeated heads: tp 8 at
    batch 256 ran 61 ms, 12x tp 4's 5.2)."""
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    times, attention_bytes = {}, {}
    for tp in (4, 8):
        e = _estimate(model="gpt-oss-20b", device=f"h100x{tp}", tp=tp, workload="decode", batch=256, seq=4096,
                      runtime="vllm", dtype="bf16")
        times[tp] = e.runtime_ms
        sc = scenario("gpt-oss-20b", f"h100x{tp}", tp=tp, runtime="vllm", dtype="bf16")
        a = op_arrays(sc, sc.workload(StepShape(phase="decode", batch=256, seq=4096)))
        names = [op.name for op in a.ops]
        assert "aten.bmm" not in names and "aten.clone" not in names, tp
        attention_bytes[tp] = sum(c.bytes * r for op, c, r in zip(a.ops, a.costs, a.repeats)
                                  if op.name == "attention.flash")
    assert times[8] < times[4]
    assert attention_bytes[8] == pytest.approx(attention_bytes[4] / 2, rel=0.02)   # 1 KV head per GPU, not 8


def test_vllm_runs_the_moe_block_as_its_fused_moe_kernels():
    """Under vllm a MoE layer is the router GEMM, one topk_softmax, moe_align, the two grouped expert GEMMs with
    one activation between, moe_sum (and the tensor-parallel all-reduce): none of HF's sort / histc / gathers /
    masked fills / inverse permutation. The expert GEMMs' bytes are untouched; the step gets shorter."""
    from aisim.scenario import scenario
    from aisim.step import op_arrays
    from aisim.workload import StepShape

    def layer_ops(runtime, **kw):
        sc = scenario("Mixtral-8x7B-v0.1", "h100x2", dtype="bf16", runtime=runtime, **kw)
        a = op_arrays(sc, sc.workload(StepShape(phase="decode", batch=4, seq=1024)))
        ops = [op for op in a.ops if op.scope.startswith("model.layers.1.mlp") and not op.attrs.get("view")
               and op.name != "module.call"]
        return [op.name for op in ops], sum(op_cost(op).bytes for op in ops if op.name == "aten._grouped_mm")

    names, grouped_bytes = layer_ops("vllm", tp=2)
    assert names == ["aten.mm", "fused.topk_softmax", "fused.moe_align", "aten._grouped_mm", "fused.moe_act",
                     "aten._grouped_mm", "fused.moe_sum", "nccl.all_reduce"]
    hf_names, hf_bytes = layer_ops("graphs", tp=2)
    assert "aten.sort" in hf_names and "aten.histc" in hf_names and grouped_bytes == pytest.approx(hf_bytes)


def test_graphs_replay_constants_are_derived_from_the_non_judged_models():
    """graphs.yaml's replay gap and per-step overhead are the least-squares fit, in aisim's own accounting, over every
    replay run of models no table judges (derive_graphs_replay's default files); with the gap so derived, aisim's
    step of those rows is within the fit's residual, and with no gap it is short of every row."""
    from aisim.specs import all_runtimes
    from aisim.validation.scripts import derive_graphs_replay as d

    fit = d.derive()
    graphs = all_runtimes()["graphs"]
    assert graphs.replay_kernel_gap_s == pytest.approx(fit["replay_kernel_gap_s"], rel=1e-3)
    assert graphs.per_step_overhead_s == pytest.approx(fit["per_step_overhead_s"], rel=1e-3)
    raw = "".join(path.read_text() for path in d.DATA)
    assert not any(f'"model":"{name}' in raw or f'"model": "{name}' in raw for name in d.JUDGED)   # not in the files
    assert len(fit["rows"]) >= 30 and {r["batch"] for r in fit["rows"]} >= {1, 8, 32}
    # the shipped runtime prices each row as the fit does: its step is the measured step plus the fit's residual
    # (a gap counted twice, or on a kernel the fit did not count, would break it)
    import tempfile
    from pathlib import Path

    from aisim.scenario import scenario
    from aisim.step import step_cost
    from aisim.workload import StepShape

    with tempfile.TemporaryDirectory() as folder:
        for r, residual_ms in zip(fit["rows"], fit["residual_ms"]):
            sc = scenario(d._config(r["model"], Path(folder)), r["device"], dtype="bf16", runtime="graphs")
            step = step_cost(sc, StepShape(phase="decode", batch=r["batch"], seq=r["context"],
                                           static_cache_len=r["max_cache_len"]))
            assert step.runtime_s * 1e3 == pytest.approx(r["step_ms"] + residual_ms, abs=0.01), r


def test_whole_mixtral_on_h200_was_predicted_for_every_measured_case():
    """The whole Mixtral-8x7B run on an H200 (moe-mixtral-h200.jsonl) is priced on the H200 (its header), every case
    has the prediction committed before the run, and memory, which no later change touched, stays within 0.2%."""
    from aisim.validation import moe_report

    rows = moe_report.compare_moe(moe_report.MIXTRAL_H200)
    assert len(rows) == 12
    assert {(r.workload, r.batch, r.context) for r in rows} == set(moe_report.MIXTRAL_H200_PREDICTED)
    for r in rows:
        assert abs(r.mem_err_pct) < 0.2
        assert r.estimated_gb == pytest.approx(moe_report.MIXTRAL_H200_PREDICTED[r.workload, r.batch, r.context][1],
                                               abs=0.01)
    predicted = [moe_report.MIXTRAL_H200_PREDICTED[r.workload, r.batch, r.context][0] for r in rows
                 if r.workload == "decode"]
    decode = moe_report._mape(predicted, [r.measured_ms for r in rows if r.workload == "decode"])
    assert f"decode {decode:.1f}%" in " ".join(moe_report.mixtral_h200_lines()) and decode > 20   # as it missed


def test_moe_models_on_h200_are_priced_on_the_h200():
    """The OLMoE / Qwen-MoE run on an H200 is estimated with h200.yaml (its header's GPU): memory within 1% on every
    case, and the large prefills, GPU-bound, within 10%, where the H100's calibration would price them differently."""
    from aisim.validation import moe_report

    rows = moe_report.compare_moe(moe_report.MOE_H200)
    assert len(rows) == 36 and all(abs(r.mem_err_pct) < 1.0 for r in rows)
    large = [r for r in rows if r.workload == "prefill" and r.batch * r.context >= 8192]
    assert len(large) == 6 and all(abs(r.time_err_pct) < 10.0 for r in large)
    text = " ".join(moe_report.moe_h200_lines())
    assert f"prefill {moe_report.moe_mape(rows)['prefill runtime']:.1f}%" in text


def test_new_moe_architectures_were_predicted_for_every_measured_case():
    """DeepSeek-V2-Lite (MLA latent cache) and gpt-oss-20b (sliding-window cache) on an H100 and an H200: every case has
    the prediction committed before the run, the report states the predictions' decode MAPE, peak memory stays
    within 0.5% on every case, and runtime MAPE under the runs' regression ceilings."""
    from aisim.validation import moe_report

    text = " ".join(moe_report.new_arch_lines())
    for path, predicted, _, _, _ in moe_report.NEW_ARCH_RUNS:
        rows = moe_report.compare_moe(path)
        assert len(rows) == 24
        assert {(r.model, r.workload, r.batch, r.context) for r in rows} == set(predicted)
        assert all(abs(r.mem_err_pct) < 0.5 for r in rows)
        decode = moe_report.new_arch_predicted_mape(rows, predicted)["decode", "runtime"]
        assert f"decode {decode:.1f}%" in text
        mape = moe_report.moe_mape(rows)
        for category, ceiling in moe_report.NEW_ARCH_CEILINGS[path.name].items():
            assert mape[category] <= ceiling, (path.name, category, mape[category])


def test_config_json_missing_fields_take_transformers_defaults_with_a_note(tmp_path):
    """A user's config.json that leaves out architecture fields is read with its transformers class's defaults, as HF
    builds the model: a DeepSeek-V3 without first_k_dense_replace keeps its 3 dense layers (not all dense, 75 GB),
    a Llama without hidden_size is priced at LlamaConfig's 4096 instead of a traceback, and the note names them."""
    import aisim

    config = json.loads((Path(__file__).resolve().parents[1] / "model_specs" / "DeepSeek-V3.json").read_text())
    config.pop("first_k_dense_replace")
    (tmp_path / "ds.json").write_text(json.dumps(config))
    full = aisim.estimate("DeepSeek-V3", "h100", workload="decode", dtype="bf16", top_ops=None)
    stripped = aisim.estimate(str(tmp_path / "ds.json"), "h100", workload="decode", dtype="bf16", top_ops=None)
    assert stripped.memory.weights_gb == pytest.approx(full.memory.weights_gb, rel=1e-6)
    assert any("first_k_dense_replace=3" in note for note in stripped.assumptions)
    llama = json.loads((Path(__file__).resolve().parents[1] / "model_specs" / "Meta-Llama-3-8B.json").read_text())
    llama.pop("hidden_size")
    (tmp_path / "llama.json").write_text(json.dumps(llama))
    est = aisim.estimate(str(tmp_path / "llama.json"), "h100", workload="decode", dtype="bf16", top_ops=None)
    assert est.runtime_ms > 0 and any("hidden_size=4096" in note for note in est.assumptions)
    shipped = str(Path(__file__).resolve().parents[1] / "model_specs" / "Meta-Llama-3-8B.json")
    notes = aisim.estimate(shipped, "h100", workload="decode", dtype="bf16", top_ops=None).assumptions
    assert not any("config.json leaves out" in n for n in notes)


def test_engine_attention_builds_none_of_hfs_4d_masks_and_long_prompts_say_they_are_chunked():
    """gpt-oss runs HF's explicit attention, which builds two [1, 1, S, S] bf16 masks before the layers (34 GB each
    at 131072 tokens) and holds them to the end; vLLM's kernel takes none: prefill of 131072 tokens on an H100 said
    'does not fit' with 89 GB of activations. Such a prompt vLLM prefills in chunks of max_num_batched_tokens: a
    note says so."""
    est = _estimate(model="gpt-oss-20b", device="h100", workload="prefill", seq=131072, runtime="vllm")
    assert est.fits and est.memory.activations_gb < 25.0
    assert any("16 steps" in n and "chunked prefill" in n for n in est.assumptions)
    short = _estimate(model="gpt-oss-20b", device="h100", workload="prefill", seq=4096, runtime="vllm")
    assert not any("chunked prefill" in n for n in short.assumptions)
    eager = _estimate(model="gpt-oss-20b", device="h100", workload="prefill", seq=4096, runtime="eager")
    assert eager.memory.activations_gb > short.memory.activations_gb      # HF itself builds its masks
    # the masks are freed when the base model returns: the LM head's all-position logits still count
    fwd = _estimate(model="gpt-oss-20b", device="h200", workload="forward", seq=32768, runtime="vllm")
    assert fwd.memory.activations_gb >= 32768 * 201088 * 2 / 1e9


def test_absorbed_mla_decode_reads_the_latent_cache_once_and_allocates_no_per_head_kv():
    """vLLM's MLA decode (FlashMLA): one latent cache of kv_lora_rank + rope columns per token and layer, whose first
    kv_lora_rank columns are the values: the attention reads it once (it read keys and values, 1.89x), and none of
    HF's cache-wide up-projection or per-head K/V buffer is allocated (DeepSeek-V3 b4 x 131072 on h200x8: 7.58 GB of
    'activations' beside a 36.8 GB cache)."""
    est = _estimate(model="DeepSeek-V3", device="h200x8", tp=8, workload="decode", batch=4, seq=131072,
                    runtime="vllm", top_ops=40)
    attention = next(r for r in est.top_ops if r.name == "attention.flash")
    assert attention.bytes / 1e9 == pytest.approx(est.memory.kv_cache_gb, rel=0.02)
    assert est.memory.activations_gb < 0.5
    hf = _estimate(model="DeepSeek-V2-Lite", device="h100", workload="decode", batch=32, seq=4096, runtime="graphs")
    assert hf.memory.activations_gb > 1.0           # HF's compiled step still up-projects the cache


def test_inference_pipeline_stages_may_hold_unequal_layer_counts():
    """DeepSeek-V3's 61 layers at pp 2 (the usual two-node vLLM deployment, TP 8 x PP 2) were refused ('does not
    divide the 61 layers'); vLLM gives the stages 30 and 31 layers (get_pp_indices): priced as 2 stages of 31, with
    a note."""
    import aisim
    from aisim.errors import AisimError

    est = aisim.estimate("DeepSeek-V3", "h100x8-ndrx2", tp=8, pp=2, workload="decode", batch=8, seq=1024,
                         runtime="vllm", dtype="bf16", top_ops=None)
    assert any("30 or 31 layers" in n for n in est.assumptions) and est.runtime_ms > 0
    # the heaviest stage holds only MoE layers (the 3 dense ones sit in the first): 30-31 of 1.41 GB per GPU each
    # (256 experts x 3 x 7168 x 2048 fp8 / 8), not the first stage's 28
    assert est.memory.weights_gb > 30 * 256 * 3 * 7168 * 2048 / 8 / 1e9
    even = aisim.estimate("Meta-Llama-3-8B", "h100x2", tp=1, pp=2, workload="decode", top_ops=None)
    assert not any("get_pp_indices" in n for n in even.assumptions)
    # training stages may be uneven too (Megatron's --decoder-first/last-pipeline-num-layers), their states those of
    # the heaviest stage: 31 MoE layers of 2.82 GB of bf16 experts per GPU (tp 8), not the first stage's 28
    train = aisim.estimate("DeepSeek-V3", "h100x8-ndrx2", tp=8, pp=2, workload="train", batch=16, seq=1024,
                           top_ops=None)
    assert any("decoder-first-pipeline-num-layers" in n for n in train.assumptions)
    assert train.memory.weights_gb > 31 * 256 * 3 * 7168 * 2048 * 2 / 8 / 1e9
    with pytest.raises(AisimError, match="exceeds the 61 layers"):
        aisim.estimate("DeepSeek-V3", "h100x8-ndrx8", tp=1, pp=64, workload="train", batch=64, seq=1024)


def test_expert_weights_count_only_the_layers_that_have_experts():
    """DeepSeek-V3's first 3 layers are dense (first_k_dense_replace): its fp8 checkpoint holds 58 x 256 experts x
    3 x 7168 x 2048 expert weights, about 654 GB, and 673 GB in all; the fp8 expert saving was taken over all 61
    layers (639.2 GB). Qwen-MoE's decoder_sparse_step / mlp_only_layers count too."""
    import aisim
    from aisim.graph.engine import moe_layer_count

    assert moe_layer_count({"num_hidden_layers": 61, "n_routed_experts": 256, "first_k_dense_replace": 3}) == 58
    assert moe_layer_count({"num_hidden_layers": 4, "num_experts": 4, "decoder_sparse_step": 2,
                            "mlp_only_layers": [3]}) == 1
    assert moe_layer_count({"num_hidden_layers": 32, "num_local_experts": 8}) == 32
    assert moe_layer_count({"num_hidden_layers": 32}) == 0
    est = aisim.estimate("DeepSeek-V3", "b200", workload="decode", seq=128, runtime="vllm", dtype="bf16",
                         top_ops=None)
    assert est.memory.weights_gb == pytest.approx(673.0, abs=1.0)


def test_ep_that_does_not_divide_the_experts_is_named_before_the_batch_check():
    import aisim
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="does not divide the 128 experts"):
        aisim.estimate("Qwen3-30B-A3B", "h100x8", workload="decode", tp=1, ep=6)


def test_vllm_fp8_runs_moe_experts_fp8_x_fp8_on_hopper_only():
    """--quant fp8 under vllm: the fused MoE's grouped expert GEMMs run fp8 x fp8 on an H100 (Fp8MoEMethod,
    use_fp8_w8a8) at the fp8 rate, each after its activation's quantization; on an A100 (Marlin, weight-only) they
    stay at the 16-bit rate."""
    import aisim

    def experts_ms(device: str, quant: str) -> float:
        est = aisim.estimate("Mixtral-8x7B-v0.1", device, workload="prefill", batch=8, seq=2048, dtype="bf16", tp=2,
                             runtime="vllm", quant=quant, top_ops=40)
        return next(r.time_ms for r in est.top_ops if r.name == "aten._grouped_mm")

    assert experts_ms("h100x2", "fp8") < 0.6 * experts_ms("h100x2", "none")
    assert experts_ms("a100x2", "fp8") == pytest.approx(experts_ms("a100x2", "none"), rel=0.02)


def test_a_checkpoint_stored_in_fp8_is_priced_in_fp8_as_the_engines_load_it():
    """DeepSeek-V3's config.json has quantization_config quant_method fp8: its weights are 1 byte each unless
    --quant says otherwise (it said 'weights take 169.56 GB per GPU' on 8 H200s, where vLLM serves it)."""
    from aisim.scenario import checkpoint_quant, scenario

    sc = scenario("DeepSeek-V3", "h200x8", tp=8, runtime="vllm", dtype="bf16")
    assert sc.quant == "fp8" and any(a.startswith("--quant fp8: the checkpoint's own") for a in sc.assumptions)
    assert checkpoint_quant({"quantization_config": {"quant_method": "awq", "bits": 4}}, "none")[0] == "int4"
    assert checkpoint_quant({"quantization_config": {"quant_method": "fp8"}}, "int4") == ("int4", None)
    assert checkpoint_quant({}, "none") == ("none", None)
    from aisim.errors import AisimError
    with pytest.raises(AisimError, match="quantization_config is a str"):
        checkpoint_quant({"quantization_config": "fp8"}, "none")
    assert checkpoint_quant({"quantization_config": {"quant_method": "gptq", "bits": 8}}, "none")[0] == "int8"
    quant, note = checkpoint_quant({"quantization_config": {"quant_method": "compressed-tensors"}}, "none")
    assert quant == "none" and "not read" in note
    train = scenario("DeepSeek-V2-Lite", "h100", dtype="bf16")   # a training step keeps its --precision
    assert train.quant == "none"
    from aisim.scenario import ScenarioRequest, resolve_scenario
    ds = resolve_scenario(ScenarioRequest(model="DeepSeek-V3", device="h200x8", tp=8, dtype="bf16"), "train", 8)
    assert ds.quant == "none" and not any("checkpoint's own" in a for a in ds.assumptions)
