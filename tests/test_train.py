"""Training plans (aisim.studies.train): precision modes, ZeRO/FSDP memory, DDP/FSDP communication, pipeline
bubble, hierarchical collectives, the CLI flags, and the measured 2 x H200 dataset's regression ceilings."""
import json
from pathlib import Path

import pytest

from aisim.cost.comm import collective_s
from aisim.cost.memory import train_breakdown
from aisim.graph.ops import Graph
from aisim.scenario import scenario
from aisim.studies.train import (TrainRequest, _pipeline_s, micro_batching, multi_node_device, train)
from aisim.workload import StepShape, TrainPlan, Workload

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "tie_word_embeddings": True, "rms_norm_eps": 1e-5}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def _graph(params: int, peak: float, layers: int = 4, layer_params: int = 0, elem: int = 2) -> Graph:
    return Graph(ops=[], repeats=[], param_count=params, param_bytes=float(params * elem), peak_activation_bytes=peak,
                 persistent_bytes=0.0, layers=layers, traced_layers=(2, 3), meta={"layer_params": layer_params})


def test_zero_paper_bytes_per_parameter():
    """Mixed-precision AdamW (DeepSpeed ZeRO layout): 2 + 2 + 12 = 16 bytes per parameter; ZeRO-3 over 8 GPUs
    divides all of it: 1e9 params -> 16 GB on one GPU, 2 GB each over 8 (activations 0, workspace aside)."""
    dev = multi_node_device("h100")
    g = _graph(10**9, 0.0, layers=4, layer_params=250_000_000)
    w = Workload(phase="forward-backward", dtype="bf16", grad_release=False)
    zero1 = train_breakdown(g, w, TrainPlan(precision="bf16-mixed", zero=1), 1, dev)
    # weights 2 + master 4 (the ZeRO-1 path on 1 GPU), optimizer 8, traced bf16 grads 2 = 16 bytes/param
    assert zero1.weights_gb + zero1.optimizer_gb + zero1.gradients_gb == pytest.approx(16.0)
    w3 = w.model_copy(update={"grad_release": True})
    z3 = train_breakdown(g, w3, TrainPlan(precision="bf16-mixed", zero=3), 8, dev)
    # 2/8 + 4/8 weights, 8/8 optimizer = 1.75 GB; then the larger of the loss point (one prefetched layer
    # unsharded: 0.25e9 x 2 = 0.5 GB) and late backward (sharded grads 2/8 = 0.25 GB + one layer's bf16 grad and
    # its 16-bit reduce copy 0.25e9 x (2 + 2) = 1 GB): 1.75 + 1.25 = 3.0
    assert z3.weights_gb + z3.optimizer_gb == pytest.approx(1.75)
    assert z3.total_gb - z3.workspace_gb == pytest.approx(3.0)


def test_ddp_buckets_double_the_gradients():
    dev = multi_node_device("h100x2")
    g = _graph(10**9, 5e9, elem=4)   # traced under autocast: fp32 weights and grads; peak holds the 4 GB grads
    w = Workload(phase="forward-backward", dtype="bf16", autocast=True)
    one = train_breakdown(g, w, TrainPlan(precision="bf16-mixed"), 1, dev)
    two = train_breakdown(g, w, TrainPlan(precision="bf16-mixed"), 2, dev)
    assert two.total_gb - one.total_gb == pytest.approx(4.0)   # DDP's flat buckets: a second fp32 gradient copy


def test_hierarchical_all_reduce_hand_worked():
    """2 nodes x 8 A100 (a100x8-hdr): 1 GB all-reduce = intra reduce-scatter + inter all-reduce of 1/8 + intra
    all-gather, the two intra halves one ring: its base latency once (NCCL's ring: baseLat + nsteps x hwLat, the
    node's 25 us split by NCCL's NVLink constants 6.6 + 14 x 0.6 us): 2 x 25e-6 - 25e-6 x 6.6 / 15 +
    2 x 7/8 * 1e9 / 230e9 + (30e-6 + 2 * 1/2 * 0.125e9 / (25e9 * 0.9))."""
    dev = multi_node_device("a100x8-hdr", 2)
    assert dev.count == 16
    from aisim.specs import load_calibration

    t = collective_s("all_reduce", 1e9, 16, dev, load_calibration(dev.gpu.name), 8)
    expected = 2 * 25e-6 - 25e-6 * 6.6 / 15 + 2 * 7 / 8 * 1e9 / 230e9 + (30e-6 + 0.125e9 / 22.5e9)
    assert t == pytest.approx(expected)
    assert multi_node_device("a100x8-hdrx4").count == 32


def test_pipeline_bubble():
    # 1F1B: (m + p - 1) t; interleaved v = 2: (m + (p - 1) / 2) t. p = 4, m = 8, t = 1: 11 and 9.5
    assert _pipeline_s(1.0, 8, 4, TrainPlan()) == 11.0
    assert _pipeline_s(1.0, 8, 4, TrainPlan(pp_schedule="interleaved", virtual_stages=2)) == 9.5


def test_micro_batching_checks():
    assert micro_batching(64, 8, TrainPlan(micro_batch=2)) == (2, 4)
    assert micro_batching(64, 8, TrainPlan(grad_accum=4)) == (2, 4)
    with pytest.raises(Exception, match="does not divide"):
        micro_batching(64, 8, TrainPlan(micro_batch=3))


def test_data_parallel_is_not_free_and_shows_its_collectives(tiny):
    one = train(scenario(tiny, "h100", dtype="bf16", tp=1, dp=1), TrainRequest(batch=2, seq=64))
    sc = scenario(tiny, "h100x8", dtype="bf16", tp=1, dp=8, batch=16)
    ddp = train(sc, TrainRequest(batch=16, seq=64))
    assert ddp.step_ms > one.step_ms
    assert any(r.name.startswith("nccl.all_reduce") for r in ddp.top_ops)
    fsdp = train(sc, TrainRequest(batch=16, seq=64, plan=TrainPlan(fsdp="full", precision="bf16-mixed")))
    names = {r.name.split(" ")[0] for r in fsdp.top_ops}
    assert {"nccl.all_gather", "nccl.reduce_scatter"} <= names
    assert fsdp.memory.weights_gb < ddp.memory.weights_gb


def test_grad_accumulation_scales_compute(tiny):
    sc = scenario(tiny, "h100", dtype="bf16", tp=1, dp=1)
    one = train(sc, TrainRequest(batch=2, seq=64))
    four = train(sc, TrainRequest(batch=8, seq=64, plan=TrainPlan(grad_accum=4)))
    assert four.phases["compute_ms"] == pytest.approx(4 * one.phases["compute_ms"])
    # micro-batches 2-4 run their forwards beside the gradients .grad accumulated from the earlier backwards
    from aisim.step import op_arrays, step_cost
    from aisim.studies.train import traced_options

    g = op_arrays(sc, step_cost(sc, StepShape(phase="forward-backward", batch=2, seq=64),
                                **traced_options(TrainPlan())).workload).graph
    peak, forward = g.peak_activation_bytes, g.meta["peak_forward_bytes"]
    grads = g.param_bytes   # fp32 under autocast
    added = max(forward + grads, peak, grads) - max(peak, grads)
    assert four.memory.total_gb - one.memory.total_gb == pytest.approx(added / 1e9)


def test_mixed_precision_traces_autocast_and_keeps_fp32_states(tiny):
    sc = scenario(tiny, "h100", dtype="bf16", tp=1, dp=1)
    mixed = train(sc, TrainRequest(batch=2, seq=64, plan=TrainPlan(precision="bf16-mixed")))
    true = train(sc, TrainRequest(batch=2, seq=64, plan=TrainPlan(precision="bf16-true")))
    assert mixed.memory.weights_gb == pytest.approx(2 * true.memory.weights_gb)
    assert mixed.memory.optimizer_gb == pytest.approx(2 * true.memory.optimizer_gb)


def test_full_recompute_costs_a_forward_and_saves_memory(tiny):
    sc = scenario(tiny, "h100", dtype="bf16", tp=1, dp=1)
    none = train(sc, TrainRequest(batch=8, seq=256))
    full = train(sc, TrainRequest(batch=8, seq=256, plan=TrainPlan(recompute="full")))
    assert full.hardware_tflops_per_gpu * full.step_ms > none.hardware_tflops_per_gpu * none.step_ms
    assert full.memory.activations_gb < none.memory.activations_gb


def test_cli_train_flags(tiny):
    from typer.testing import CliRunner

    from aisim.cli import app

    out = CliRunner().invoke(app, ["estimate", "--model", str(tiny), "--device", "h100x2", "--workload", "train",
                                   "--batch", "4", "--seq", "64", "--tp", "1", "--zero", "3", "--precision",
                                   "bf16-mixed", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    # ZeRO 3: FSDP's reduce-scatter is costed (among all ops: a tiny model's fall out of the top 12)
    assert data["phases"]["comm_total_ms"] > 0 and any("ZeRO stage 3" in a for a in data["assumptions"])
    import aisim

    from aisim.studies.train import TrainPlan

    est = aisim.estimate(str(tiny), "h100x2", workload="train", batch=4, seq=64, tp=1, top_ops=None,
                         train=TrainPlan(zero=3, precision="bf16-mixed"))
    assert any(r.name.startswith("nccl.reduce_scatter") for r in est.top_ops)
    bad = CliRunner().invoke(app, ["estimate", "--model", str(tiny), "--device", "h100", "--zero", "2"])
    assert bad.exit_code == 2 and "train only" in bad.output


def test_measured_training_steps_stay_under_their_ceilings():
    """validation/data/train (2 x H200, 4 x H100): runtime and peak-memory MAPE under the ceilings set beside the goals."""
    from aisim.validation import train_report

    s = train_report.summary(train_report.rows())
    assert s["runtime_mape_pct"] <= train_report.RUNTIME_CEILING_PCT
    assert s["memory_mape_pct"] <= train_report.MEMORY_CEILING_PCT
    # one known miss (a regression gate, not a goal met): Llama-1B 32-true 4 x 2048 on one H100 ran out of memory,
    # aisim predicts 55 GB (validation/data/train/train-precision-h100.jsonl); every other verdict is right
    assert s["cases"] - s["fit_verdicts_right"] <= train_report.FIT_VERDICT_MISSES_CEILING


def test_measured_moe_training_steps_stay_under_their_ceilings():
    """validation/data/moe/moe-train-h100.jsonl (OLMoE, Qwen1.5-MoE and Mixtral training steps in HF eager on one
    H100, predicted before they ran): runtime and memory MAPE under their ceilings, every fit verdict right."""
    from aisim.validation import train_report

    table = train_report.rows([train_report.MOE_TRAIN])
    s = train_report.summary(table)
    assert s["cases"] == 7 and s["fit_verdicts_right"] == 7
    assert s["runtime_mape_pct"] <= train_report.MOE_RUNTIME_CEILING_PCT
    assert s["memory_mape_pct"] <= train_report.MOE_MEMORY_CEILING_PCT


def test_published_megatron_table_stays_under_its_ceiling():
    """Narayanan et al. 2021 Table 1 (10 GPT models, 32-3072 A100s): per-GPU throughput MAPE under the ceiling,
    every row fits in 80 GB as it ran."""
    from aisim.validation import published_train

    table = published_train.rows()
    assert all(r["fits"] for r in table)
    assert published_train.throughput_mape(table) <= published_train.THROUGHPUT_CEILING_PCT


def test_multi_node_hybrid_shard_all_reduces_across_nodes(tiny):
    dev = multi_node_device("a100x8-hdrx2")
    sc = scenario(tiny, dev, dtype="bf16", tp=1, dp=16, batch=32)
    hybrid = train(sc, TrainRequest(batch=32, seq=64, plan=TrainPlan(fsdp="hybrid", precision="bf16-mixed")))
    assert any(r.name.startswith("nccl.all_reduce (HSDP") for r in hybrid.top_ops)
    with pytest.raises(Exception, match="contradicts"):
        TrainPlan(zero=1, fsdp="full")


def test_pipeline_first_stage_holds_pp_micro_batches_hand_worked():
    """1F1B: the first stage holds min(pp, m) micro-batches' saved activations (Narayanan et al. 2021 sec. 2.2).
    A 10-layer stage saving 2 GB per layer of a micro-batch, forward peak 21 GB (the 20 GB saved + the loss),
    backward peak 22 GB (20 GB of bf16 gradients + 2 GB), 10e9 bf16-true parameters, pp 4, m 16 > pp:
    held = (4 - 1) x 10 x 2 = 60 GB; live = 60 + max(21 + 20 accumulated gradients, 22) = 101 GB;
    total = weights 20 + AdamW 40 + 101 = 161 GB (+ workspace); activations = 60 + max(21, 22 - 20) = 81 GB.
    (The peak less the gradients, 2 GB, used to stand for a micro-batch: 8 GB of activations.)"""
    dev = multi_node_device("h100")
    g = Graph(ops=[], repeats=[], param_count=10**10, param_bytes=2e10, peak_activation_bytes=22e9,
              persistent_bytes=0.0, layers=10, traced_layers=(2, 3),
              meta={"saved_per_layer_bytes": 2e9, "peak_forward_bytes": 21e9})
    w = Workload(phase="forward-backward", dtype="bf16")
    mem = train_breakdown(g, w, TrainPlan(precision="bf16-true"), 1, dev, in_flight=4.0, accumulating=True)
    assert mem.activations_gb == pytest.approx(81.0)
    assert mem.total_gb - mem.workspace_gb == pytest.approx(161.0)
    drained = train_breakdown(g, w, TrainPlan(precision="bf16-true"), 1, dev, in_flight=4.0)   # m = pp: no forward
    assert drained.total_gb - drained.workspace_gb == pytest.approx(20 + 40 + 60 + 22)    # after a backward


def test_pipeline_stage_of_a_70b_model_holds_its_micro_batches():
    """llama-2-70b, pp 4 (20 layers a stage), micro-batch 1 x 16, seq 4096: the first stage holds 4 micro-batches
    of 20 layers (about 1.7 GB each at bf16, no recompute): over 130 GB, far beyond an H100. It reported 1.84 GB
    of activations and a 7B model's stage 17.3 GB (issue 15)."""
    from aisim.step import op_arrays, step_cost
    from aisim.studies.train import traced_options

    plan = TrainPlan(zero=1, micro_batch=1)
    sc = scenario("llama-2-70b", "h100x8", dtype="bf16", tp=1, pp=4, dp=2, batch=32)
    r = train(sc, TrainRequest(batch=32, seq=4096, plan=plan))
    mb = step_cost(sc, StepShape(phase="forward-backward", batch=2, seq=4096), **traced_options(plan))
    g = op_arrays(sc, mb.workload).graph
    per_layer = g.meta["saved_per_layer_bytes"]
    assert 1.0e9 < per_layer < 2.5e9 and g.layers == 20
    assert r.memory.activations_gb * 1e9 >= 4 * 20 * per_layer
    assert not r.fits and r.flops_per_gpu > 0 and r.bytes_per_gpu > 0   # the work of a plan that does not fit
    # one micro-batch in flight and no pipeline: the whole model's 80 layers over tp 8
    full = train(scenario("llama-2-70b", "h100x8", dtype="bf16", tp=8, pp=1, dp=1, batch=32),
                 TrainRequest(batch=32, seq=4096, plan=TrainPlan(zero=1, micro_batch=1)))
    assert full.memory.activations_gb > 50


def test_model_flops_per_token_hand_worked(tiny):
    """TINY: h 64, 2 layers, 4 heads x 16, 2 KV heads, SwiGLU 128, vocab 256. Attention projections
    64 x 16 x (2 x 4 + 2 x 2) = 12288, MLP 3 x 64 x 128 = 24576, per layer 36864, x 2 = 73728, logit layer
    256 x 64 = 16384: N = 90112, 6 N = 540672; causal attention 6 x 2 layers x 64 x (64 + 1) = 49920 at seq 64:
    590592 (PaLM's full square, 12 x 2 x 64 x 64 = 98304, counted work a causal kernel skips)."""
    from aisim.studies.train import model_flops_per_token

    assert model_flops_per_token(TINY, 64) == 540672 + 49920
    assert model_flops_per_token(TINY, 0) == 540672


def test_mfu_never_exceeds_hardware_utilisation_without_recompute(tiny):
    sc = scenario(tiny, "h100x2", dtype="bf16", tp=1, dp=2, batch=8)
    for seq in (64, 512):
        r = train(sc, TrainRequest(batch=8, seq=seq, plan=TrainPlan(fsdp="full", precision="bf16-mixed")))
        assert r.model_tflops_per_gpu <= r.hardware_tflops_per_gpu


def test_training_that_does_not_fit_reports_its_work(tiny):
    sc = scenario(tiny, "h100", dtype="bf16", tp=1, dp=1)
    fits = train(sc, TrainRequest(batch=2, seq=4096))
    big = train(sc, TrainRequest(batch=4096, seq=4096))
    assert fits.fits and not big.fits
    # it used to report 0 FLOPs; the work of 2048 x the batch (to the per-batch terms of the loss)
    assert big.flops_per_gpu == pytest.approx(2048 * fits.flops_per_gpu, rel=1e-4)
    assert big.bytes_per_gpu > 0 and big.top_ops


def test_options_a_workload_would_ignore_are_refused(tiny):
    from aisim.api import estimate
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="quantized training is not modelled"):
        estimate(tiny, "h100", workload="train", batch=2, seq=64, quant="int4")
    with pytest.raises(AisimError, match="keeps no KV cache"):
        estimate(tiny, "h100", workload="train", batch=2, seq=64, kv_dtype="fp8")
    with pytest.raises(AisimError, match="applies to --workload train only"):
        estimate(tiny, "h100", workload="decode", batch=2, seq=64, optimizer="sgd")
    sgd = estimate(tiny, "h100", workload="train", batch=2, seq=64, optimizer="sgd")
    assert sgd.memory.optimizer_gb == 0.0 and any("SGD" in a for a in sgd.assumptions)


def test_zero_without_data_parallel_ranks_says_it_changes_nothing():
    from aisim.api import estimate
    from aisim.workload import TrainPlan

    e = estimate("Meta-Llama-3-8B", "h100x8", workload="train", batch=8, seq=512, dtype="bf16", tp=8,
                 train=TrainPlan(precision="bf16-true", zero=3))
    assert e.plan.dp == 1 and any("with dp 1 it changes nothing" in a for a in e.assumptions)


def test_a_sharded_training_plan_defaults_to_data_parallel():
    """ZeRO / FSDP shard over the data-parallel ranks: with no --tp the default plan is data parallel over as many
    GPUs as divide the batch (it was tensor parallel 8, where ZeRO changed nothing). Plain DDP: the fastest split of a
    node into tensor x data parallel whose replicas fit, each costed (bf16-true Llama-3-8B at batch 8 x 512: tp 1 x dp 8
    fits, 80.3 of 82.6 GB, but its 16 GB gradient all-reduce makes it the slowest; bf16-mixed: tp 1 does not fit,
    fp32 weights, gradients and DDP's buckets being 160 GB a replica); GPT-2, small: every GPU a DDP replica."""
    from aisim.api import estimate
    from aisim.workload import TrainPlan

    kw = dict(workload="train", seq=512, dtype="bf16")
    zero3 = estimate("Meta-Llama-3-8B", "h100x8", batch=8, train=TrainPlan(precision="bf16-true", zero=3), **kw)
    assert (zero3.plan.tp, zero3.plan.dp) == (1, 8) and any("shards over the data-parallel" in a
                                                            for a in zero3.assumptions)
    fsdp = estimate("Meta-Llama-3-8B", "h100x8", batch=4, train=TrainPlan(precision="bf16-true", fsdp="full"), **kw)
    assert (fsdp.plan.tp, fsdp.plan.dp) == (2, 4)
    ddp = estimate("Meta-Llama-3-8B", "h100x8", batch=8, train=TrainPlan(precision="bf16-true"), **kw)
    note = next(a for a in ddp.assumptions if a.startswith("default plan: tensor parallel"))
    assert (ddp.plan.tp, ddp.plan.dp) == (4, 2) and ddp.fits and "tp 1 x dp 8" in note and "tp 8 x dp 1" in note
    times = {t: estimate("Meta-Llama-3-8B", "h100x8", batch=8, train=TrainPlan(precision="bf16-true"), tp=t,
                         **kw).runtime_ms for t in (1, 8)}
    assert ddp.runtime_ms < min(times.values()) and ddp.runtime_ms == pytest.approx(float(note.split(
        "tp 4 x dp 2: ")[1].split(" ms")[0].replace(",", "")), rel=1e-3)
    assert zero3.memory.total_gb < ddp.memory.total_gb
    mixed = estimate("Meta-Llama-3-8B", "h100x8", batch=8, train=TrainPlan(precision="bf16-mixed"), **kw)
    assert mixed.fits and "tp 1 x dp 8" not in next(a for a in mixed.assumptions if a.startswith("default plan:"))
    small = estimate("gpt2", "h100x8", batch=64, train=TrainPlan(precision="bf16-mixed"), **kw)
    assert (small.plan.tp, small.plan.dp) == (1, 8)
    assert not estimate("Meta-Llama-3-8B", "h100x8", batch=8, train=TrainPlan(precision="bf16-mixed"), tp=1,
                        **kw).fits


def test_the_fit_check_counts_the_cuda_context_and_nccls_buffers():
    """Memory a PyTorch process holds outside its allocator (derive_runtime_memory: NVML used - torch reserved in
    the suite runs) counts against the GPU: a peak between the usable memory and the capacity does not fit."""
    from aisim import estimate
    from aisim.results import MemoryBreakdown
    from aisim.specs import load_calibration
    from aisim.studies.common import not_fit_reason
    from aisim.validation.scripts import derive_runtime_memory as d

    derived = d.derive()
    for name in ("h100-sxm", "h200", "default"):
        cal = load_calibration(name)
        assert (cal.cuda_context_bytes, cal.nccl_buffer_bytes) == (derived[name]["cuda_context_bytes"],
                                                                   derived[name]["nccl_buffer_bytes"])
    one = estimate("opt-125m", "h100", workload="decode", batch=1, seq=128, dtype="bf16").memory
    two = estimate("opt-125m", "h100x2", workload="decode", batch=1, seq=128, dtype="bf16", tp=2).memory
    assert one.runtime_reserved_gb == pytest.approx(1.31) and two.runtime_reserved_gb == pytest.approx(1.31 + 1.65)
    ggml = estimate("whisper-medium.en", "gtx-1650-mobile", workload="encode", batch=1, dtype="fp16",
                    runtime="ggml-cuda").memory
    assert ggml.runtime_reserved_gb == 0.0 and ggml.usable_gb == ggml.capacity_gb
    between = one.model_copy(update={"total_gb": one.capacity_gb - 0.5})
    reason = not_fit_reason(between, "h100-sxm")
    assert reason.startswith("does not fit") and "84.21 GB usable of the 85.52 GB" in reason
    assert "(1.31 GB CUDA context)" in reason and "NCCL" not in reason and "gradients" not in reason
    assert reason.endswith("or a GPU with more memory")
    assert "1.31 GB CUDA context + 1.65 GB NCCL buffers" in not_fit_reason(
        two.model_copy(update={"total_gb": two.capacity_gb}), "h100-sxm")
    assert not_fit_reason(one, "h100-sxm") is None
    assert MemoryBreakdown(**{**between.model_dump(exclude={"usable_gb"}), "runtime_reserved_gb": 0.0}
                           ).usable_gb == between.capacity_gb


def test_training_refuses_inference_runtimes_and_its_hint_names_training_options():
    from aisim.api import estimate
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="inference runtime"):
        estimate("Meta-Llama-3-8B", "h100", workload="train", batch=8, seq=512, dtype="bf16", runtime="vllm")
    e = estimate("Meta-Llama-3-8B", "h100", workload="train", batch=8, seq=2048, dtype="bf16")
    assert not e.fits and "--recompute full" in e.not_fit_reason and "--kv-dtype" not in e.not_fit_reason


def test_moe_model_flops_count_the_active_parameters():
    """MFU's N for MoE models is the active parameters (routed top-k, shared experts, router; published: Mixtral-8x7B
    12.9B, Qwen3-30B-A3B 3.3B, OLMoE 1.3B with embeddings), not one expert's MLP."""
    from aisim import catalog
    from aisim.studies.train import model_flops_per_token

    def active_b(model):
        return model_flops_per_token(catalog.resolve_model(model)[1], 0) / 6 / 1e9

    assert 12.5 < active_b("Mixtral-8x7B-v0.1") < 13.0
    assert 2.9 < active_b("Qwen3-30B-A3B") < 3.3
    assert 1.1 < active_b("OLMoE-1B-7B-0924") < 1.3
    from aisim.studies.train import matmul_params

    held = matmul_params(catalog.resolve_model("Mixtral-8x7B-v0.1")[1], active=False) / 1e9    # plan train's bound
    assert 46.0 < held < 47.0     # published 46.7B with the embedding


def test_training_tensor_parallel_is_vocab_parallel_as_megatron_runs_it():
    """Training's tensor parallelism shards the vocabulary too (Megatron's VocabParallelEmbedding, output layer and
    vocab-parallel cross entropy): the logits stay sharded (no all-gather, no reduce-scatter in backward, the loss
    over this rank's half: half the log-softmax bytes of one GPU's), the loss adds three small all-reduces, the LM head
    and embedding weights are 1/tp per GPU. It replicated the head and embedding on every TP rank: Llama-3-8B at
    tp 8, 41.2 GB per GPU (7.7 GB of weights) where Megatron holds about 21 (4.0)."""
    from aisim.api import estimate
    from aisim.workload import TrainPlan

    kw = dict(model="opt-125m", workload="train", batch=2, seq=256, dtype="bf16", top_ops=300)
    one, two = estimate(device="h100", **kw), estimate(device="h100x2", tp=2, **kw)
    ops = {e: {o.name: o for o in est.top_ops} for e, est in (("one", one), ("two", two))}
    assert "nccl.all_gather" not in ops["two"] and "nccl.reduce_scatter" not in ops["two"]
    assert ops["two"]["aten._log_softmax"].bytes == pytest.approx(ops["one"]["aten._log_softmax"].bytes / 2)
    assert any("vocab-parallel cross entropy" in a for a in two.assumptions)
    # a new-user test read TP plans' step times as Megatron's: the note says what is not modelled
    assert any("no sequence parallelism" in a and "upper bound" in a for a in two.assumptions)
    assert not any("no sequence parallelism" in a for a in one.assumptions)
    plan = TrainPlan(precision="bf16-mixed", micro_batch=1, recompute="full")
    llama = {s: estimate(model="Meta-Llama-3-8B", device="h100x8", workload="train", batch=8, seq=4096, tp=8,
                         tp_scope=s, train=plan, top_ops=None) for s in ("all", "layers")}
    # 'layers' keeps the head and embedding replicated (a plain HF model sharded by hand): 2 x 128256 x 4096 more
    # fp32 weights per GPU, less their vocab-parallel share
    extra = 2 * 128256 * 4096 * 4 * (1 - 1 / 8) / 1e9
    assert llama["layers"].memory.weights_gb - llama["all"].memory.weights_gb == pytest.approx(extra, rel=0.01)


def test_dtype_auto_trains_in_the_checkpoints_dtype():
    from aisim.studies.train import default_precision

    assert default_precision("auto", "gpt2") == "32-true"            # float32 checkpoint
    assert default_precision("auto", "Meta-Llama-3-8B") == "bf16-true"
    assert default_precision("auto", "opt-1.3b") == "16-true"
    assert default_precision("fp16", "gpt2") == "16-true"


# ------------------------------------------------------------------ MoE training with expert parallelism

def _moe_train(device: str, ep: int, zero: int = 0, precision: str = "bf16-true", batch: int = 8, tp: int = 1,
               nodes: int | None = None):
    import aisim

    return aisim.estimate("OLMoE-1B-7B-0924", device, workload="train", batch=batch, seq=256, tp=tp, ep=ep,
                          nodes=nodes, train=TrainPlan(precision=precision, zero=zero, micro_batch=1))


def test_expert_parallel_training_moves_tokens_both_ways_and_reduces_experts_over_their_replicas():
    """OLMoE (16 MoE layers, 64 experts) on 8 GPUs, dp 8: at ep 8 each GPU holds 8 experts, the routed tokens go
    out and back by all-to-all in forward and their gradients in backward (4 per MoE layer), and DDP all-reduces
    only the dense parameters' gradients (the experts have no replica: expert-data-parallel size 1); at ep 1 every
    parameter is replicated and all-reduced."""
    from aisim.step import state_groups

    one, eight = _moe_train("h100x8", 1), _moe_train("h100x8", 8)
    rows = {e: {r.name.split(" (")[0]: r for r in est.top_ops} for e, est in ((1, one), (8, eight))}
    assert rows[8]["nccl.all_to_all"].count == 4 * 16 and "nccl.all_to_all" not in rows[1]
    sc = scenario("OLMoE-1B-7B-0924", "h100x8", dtype="bf16", tp=1, dp=8, ep=8)
    graph = __import__("aisim.step", fromlist=["op_arrays"]).op_arrays(
        sc, sc.workload(StepShape(phase="forward-backward", batch=8, seq=256))).graph
    (dense, dp, _), (experts, expert_dp, stride) = state_groups(sc, graph.param_count, graph.layers)
    assert (dp, expert_dp, stride) == (8, 1, 8)
    assert experts == pytest.approx(16 * 64 / 8 * 3 * 2048 * 1024)       # 8 experts x 3 x hidden x moe width
    assert rows[8]["nccl.all_reduce"].bytes == pytest.approx(2 * dense)   # bf16 gradients of the dense part only
    assert rows[1]["nccl.all_reduce"].bytes > 5 * rows[8]["nccl.all_reduce"].bytes
    assert eight.memory.optimizer_gb < one.memory.optimizer_gb / 4


def test_expert_states_shard_over_the_expert_data_parallel_ranks():
    """ZeRO-1 on 16 GPUs (two h100x8 NDR nodes), ep 8: the dense parameters' AdamW states split 16 ways, the
    experts' 2 ways (the two GPUs holding the same 8 experts)."""
    from aisim.cost.memory import ADAM_STATES
    from aisim.step import op_arrays, state_groups

    est = _moe_train("h100x8-ndr", 8, zero=1, batch=16, nodes=2)
    dev = multi_node_device("h100x8-ndr", 2)
    sc = scenario("OLMoE-1B-7B-0924", dev, dtype="bf16", tp=1, dp=16, ep=8)
    graph = op_arrays(sc, sc.workload(StepShape(phase="forward-backward", batch=16, seq=256))).graph
    (dense, dp, _), (experts, expert_dp, _) = state_groups(sc, graph.param_count, graph.layers)
    assert (dp, expert_dp) == (16, 2)
    assert experts == pytest.approx(16 * 64 / 8 * 3 * 2048 * 1024)        # 8 of the 64 experts per GPU, 16 layers
    assert dense == pytest.approx(graph.param_count - experts)
    assert est.memory.optimizer_gb == pytest.approx(ADAM_STATES * 2 * (dense / 16 + experts / 2) / 1e9)


def test_all_to_all_across_nodes_runs_at_the_nic_share():
    """An all-to-all of 16 ranks over two 8-GPU nodes sends half of each rank's rows through its NIC share
    (400 Gb/s per GPU on h100x8-ndr); within one node it is NVLink's ring figure."""
    from aisim.cost.comm import _all_to_all_across_nodes_s

    dev = multi_node_device("h100x8-ndr", 2)
    net = dev.system.network
    nbytes = 64e6
    t16 = _all_to_all_across_nodes_s(nbytes, 16, 1, dev, scenario("OLMoE-1B-7B-0924", dev).calibration)
    nic = net.nic_bw_bytes_per_s * net.nics_per_node / dev.system.gpus_per_node * net.bus_bw_fraction
    assert t16 == pytest.approx(net.latency_s + 8 / 16 * nbytes / nic)
    assert _all_to_all_across_nodes_s(nbytes, 8, 1, dev, scenario("OLMoE-1B-7B-0924", dev).calibration) is None
    # ranks 2 apart: 4 of the group per node, 12 of 16 peers off-node
    t_tp2 = _all_to_all_across_nodes_s(nbytes, 16, 2, dev, scenario("OLMoE-1B-7B-0924", dev).calibration)
    assert t_tp2 == pytest.approx(net.latency_s + 12 / 16 * nbytes / nic)
    # the traced group is ep consecutive GPUs (whole tp groups): tp 2 x ep 8 on two nodes stays inside one node
    import aisim

    est = aisim.estimate("Mixtral-8x7B-v0.1", "h100x8-ndr", nodes=2, workload="train", batch=16, seq=1024, tp=2,
                         ep=8, train=TrainPlan(precision="bf16-true", zero=1, micro_batch=1), top_ops=None)
    a2a = next(r for r in est.top_ops if r.name == "nccl.all_to_all")
    inside = aisim.estimate("Mixtral-8x7B-v0.1", "h100x8", workload="train", batch=8, seq=1024, tp=2, ep=8,
                            train=TrainPlan(precision="bf16-true", zero=1, micro_batch=1), top_ops=None)
    assert a2a.time_ms == pytest.approx(next(r for r in inside.top_ops if r.name == "nccl.all_to_all").time_ms)


def test_mixed_precision_moe_training_runs_hf_experts_in_fp32():
    """bf16-mixed DDP runs the model under autocast with fp32 weights; grouped_mm is not autocast-enabled and HF
    casts the tokens to the experts' fp32 (ATen's per-group fallback on CUDA): the trace used to fail on the meta
    kernel's bf16 check. The experts now read fp32 weights (batch 1 x 256: memory-bound, twice the bytes of the
    same step in bf16-true)."""
    mixed = _moe_train("h100", 1, precision="bf16-mixed", batch=1)
    true = _moe_train("h100", 1, precision="bf16-true", batch=1)
    grouped = {e: next(r for r in est.top_ops if r.name == "aten._grouped_mm") for e, est in (("m", mixed),
                                                                                             ("t", true))}
    assert grouped["m"].bytes == pytest.approx(2 * grouped["t"].bytes, rel=0.01)
    assert grouped["m"].time_ms > 1.5 * grouped["t"].time_ms


def test_plan_train_searches_expert_parallel_degrees_for_moe_models_only():
    from aisim.errors import AisimError
    from aisim.studies.plan_train import expert_degrees, plan_train, plan_train_request
    from aisim.catalog import resolve_model

    assert expert_degrees(resolve_model("OLMoE-1B-7B-0924")[1]) == [1, 8, 64]
    assert expert_degrees(resolve_model("Mixtral-8x7B-v0.1")[1]) == [1, 8]
    assert expert_degrees(resolve_model("Meta-Llama-3-8B")[1]) == [1]
    r = plan_train(plan_train_request(model="OLMoE-1B-7B-0924", tokens=1e11, seq=1024, global_batch=64,
                                      devices=["h100"], gpus=[8], tp=[1], pp=[1], zero=[0], recompute=["none"],
                                      micro_batch=[1], precision="bf16-true"))
    assert {c.ep for c in r.ranked} == {1, 8} and r.pruned.get("shape: ep does not divide tp x dp") == 1
    with pytest.raises(AisimError, match="does not divide the 64 experts"):
        plan_train(plan_train_request(model="OLMoE-1B-7B-0924", tokens=1e11, seq=1024, global_batch=64,
                                      devices=["h100"], gpus=[8], ep=[3]))
    with pytest.raises(AisimError, match="mixture-of-experts models only"):
        plan_train(plan_train_request(model="Meta-Llama-3-8B", tokens=1e11, seq=1024, global_batch=64,
                                      devices=["h100"], gpus=[8], ep=[2]))


def test_pipeline_stages_hold_one_vocabulary_matrix_and_not_both_ends_activations():
    """The traced stage has the embedding, the LM head and the loss; with pp > 1 an untied model's first stage holds
    the embedding and min(pp, m) micro-batches of saved activations, its last the head, the logits and the loss of
    one micro-batch: the states lose one 128256 x 4096 matrix (Llama-3-8B, untied), and the memory is the larger
    of the two stages, not the first stage's activations beside the last stage's loss."""
    from aisim.step import op_arrays, pipeline_vocab_params, state_groups
    from aisim.workload import ParallelPlan

    base = scenario("Meta-Llama-3-8B", "h100x8", dtype="bf16", tp=1, pp=1, dp=8)
    sc = base.with_plan(ParallelPlan(tp=1, pp=4, dp=2))
    assert pipeline_vocab_params(sc) == 128256 * 4096
    assert pipeline_vocab_params(base) == 0.0
    gpt2 = scenario("gpt2", "h100x8", dtype="bf16", tp=1, pp=1, dp=8)
    assert pipeline_vocab_params(gpt2.with_plan(ParallelPlan(tp=1, pp=4, dp=2))) == 0.0   # tied: a copy on both
    w = sc.workload(StepShape(phase="forward-backward", batch=2, seq=2048))
    graph = op_arrays(sc, w).graph
    groups = state_groups(sc, graph.param_count, graph.layers)
    assert sum(n for n, *_ in groups) == pytest.approx(graph.param_count - 128256 * 4096)
    plan = TrainPlan(precision="bf16-mixed", zero=1, micro_batch=1)
    dev = sc.device
    both = train_breakdown(graph, w, plan, 2, dev, in_flight=4)                         # the old costing
    split = train_breakdown(graph, w, plan, 2, dev, in_flight=4, groups=groups, pp=4)
    assert split.weights_gb < both.weights_gb and split.total_gb < both.total_gb
    tail = graph.meta["peak_forward_bytes"] - graph.meta["saved_per_layer_bytes"] * graph.layers
    assert tail > 0 and split.activations_gb <= both.activations_gb - min(tail, 3 * graph.meta[
        "saved_per_layer_bytes"] * graph.layers) / 1e9 + 1e-9


def test_training_a_quantized_checkpoint_trains_its_weights_in_the_precision_dtype():
    """New-user test: plan train resolved DeepSeek-V3 with its fp8 quantization_config (a forward scenario) where
    estimate --workload train did not (4% apart); gpt-oss trained 'with MXFP4 experts'. Training leaves the
    quantization_config out, with a note, in both."""
    from aisim.studies.plan_train import _assumptions, plan_train_request
    from aisim.catalog import resolve_model

    for model in ("DeepSeek-V3", "gpt-oss-20b"):
        sc = scenario(model, "h100x8", dtype="bf16", phase="train", tp=1, dp=8)
        assert sc.quant == "none" and "quantization_config" not in sc.config
        assert any("trained in the precision's dtype" in a for a in sc.assumptions)
        assert not any("MXFP4" in a for a in sc.assumptions)
    req = plan_train_request(model="DeepSeek-V3", tokens=1e12, seq=4096, global_batch=1024, devices=["h100"],
                             gpus=[64], pp=[1, 4, 64])
    notes = _assumptions(req, resolve_model("DeepSeek-V3")[1])
    assert any("fp8 weights are trained" in n for n in notes)
    # the uneven-stages note names only the degrees searched (64 > 61 layers is pruned, not priced)
    assert any("--pp 4 over 61 layers" in n for n in notes) and not any("64 over" in n for n in notes)


def test_hybrid_shard_keeps_a_node_sized_shard_of_the_states():
    """Reviewer: HSDP's memory and optimizer divided the states over every data-parallel rank, as FULL_SHARD;
    HYBRID_SHARD shards them inside a node (8 of the 16 ranks) and all-reduces the shards across the replicas,
    overlapped with the backward as the reduce-scatters are."""
    import aisim

    kw = dict(workload="train", batch=32, seq=4096, tp=1, nodes=2, top_ops=None)
    est = {f: aisim.estimate("Meta-Llama-3-8B", "h100x8-ndr", train=TrainPlan(precision="bf16-mixed", fsdp=f,
                                                                                recompute="full", micro_batch=1),
                             **kw) for f in ("full", "hybrid")}
    assert est["hybrid"].memory.weights_gb == pytest.approx(2 * est["full"].memory.weights_gb)
    assert est["hybrid"].memory.optimizer_gb == pytest.approx(2 * est["full"].memory.optimizer_gb)
    assert est["hybrid"].runtime_ms < 1.1 * est["full"].runtime_ms


def test_expert_parallel_above_tp_must_be_whole_tp_groups():
    import aisim
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="must be a multiple of it"):
        aisim.estimate("Qwen1.5-MoE-A2.7B", "h100x8-ndr", nodes=3, workload="train", batch=24, seq=512, tp=4, ep=6)


def test_cli_training_without_dtype_is_bf16_mixed():
    from typer.testing import CliRunner

    from aisim.cli import app

    out = CliRunner().invoke(app, ["estimate", "-m", "opt-125m", "-d", "h100", "--workload", "train", "--batch",
                                   "2", "--seq", "256"])
    assert out.exit_code == 0 and "training: bf16-mixed" in " ".join(out.output.split())
    fp16 = CliRunner().invoke(app, ["estimate", "-m", "opt-125m", "-d", "h100", "--workload", "train", "--batch",
                                    "2", "--seq", "256", "--dtype", "fp16"])
    assert "training: 16-true" in " ".join(fp16.output.split())


def test_interleaved_schedule_is_refused_where_megatron_cannot_run_it():
    from aisim import estimate
    from aisim.errors import AisimError

    kw = dict(model="Meta-Llama-3-8B", device="h100x8", workload="train", tp=2, pp=2, top_ops=None)
    for v, batch, accum, said in ((32, 16, 4, "choose one of 2, 4, 8, 16"), (17, 16, 4, "split evenly"),
                                  (4, 8, 1, "multiples of --pp 2")):
        with pytest.raises(AisimError, match=said):
            estimate(batch=batch, train=TrainPlan(pp_schedule="interleaved", virtual_stages=v, grad_accum=accum), **kw)
    ok = estimate(batch=16, train=TrainPlan(pp_schedule="interleaved", virtual_stages=4, grad_accum=4), **kw)
    assert ok.fits and any("(m v)" in a for a in ok.assumptions)
    assert any("bubble (pp - 1) / m =" in a for a in estimate(batch=16, train=TrainPlan(grad_accum=4), **kw).assumptions)


def test_tensor_parallel_across_nodes_pays_the_network():
    """A tensor-parallel all-reduce of a group wider than a node (tp 16 on two 8-GPU nodes) runs hierarchically
    over the network (it was priced as one 16-GPU NVSwitch host: 16.9 us, as tp 8 in one node); NAMExN past one
    host's GPUs names whole nodes of the GPU's multi-node system."""
    import aisim
    from aisim.catalog import resolve_device
    from aisim.cost.comm import NCCL_NVLINK_BASE_S, _nccl_ring_latency, collective_s
    from aisim.specs import load_calibration

    cal, ar = load_calibration("h100-sxm"), 4096 * 8192 * 2   # one 67 MB all-reduce of the hidden states
    kw = dict(model="Meta-Llama-3-70B", workload="prefill", seq=4096, runtime="vllm", top_ops=None)
    two = aisim.estimate(device="h100x8-ndrx2", tp=16, **kw)
    row = next(r for r in two.top_ops if r.name == "nccl.all_reduce")
    cross = collective_s("all_reduce", ar, 16, resolve_device("h100x8-ndrx2"), cal, 8)
    assert row.time_ms == pytest.approx(row.count * cross * 1e3, rel=1e-6)   # the estimate prices it that way
    intra = collective_s("all_reduce", ar, 8, resolve_device("h100x8"), cal)
    # the node's ring (its base latency once, both halves' bytes) + the network's all-reduce of 1/8 over 2 nodes
    base = 16.8e-6 * NCCL_NVLINK_BASE_S / _nccl_ring_latency(8)
    assert cross == pytest.approx(intra + 16.8e-6 - base + 30e-6 + ar / 8 / (50e9 * 0.9))
    assert resolve_device("h100x16").system.name == "h100x8-ndrx2"


def test_train_not_fit_hint_leaves_out_what_the_plan_already_does():
    from aisim.studies.common import train_not_fit_hint

    full = train_not_fit_hint(0, "none", 4)
    assert "--zero 1-3" in full and "--micro-batch" in full and "--recompute full" in full
    done = train_not_fit_hint(3, "full", 1)
    assert "--zero" not in done and "--micro-batch" not in done and "--recompute" not in done and "--tp" in done
    assert "--zero 3" in train_not_fit_hint(1, "none", 1)
    assert "--zero" not in train_not_fit_hint(2, "none", 1, "grad-op")
    assert "--fsdp full" in train_not_fit_hint(2, "none", 1, "grad-op")
    assert "--fsdp full" in train_not_fit_hint(3, "none", 1, "hybrid")
