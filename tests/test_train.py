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
from aisim.workload import TrainPlan, Workload

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
    all-gather: 2 x (25e-6 + 7/8 * 1e9 / 230e9) + (30e-6 + 2 * 1/2 * 0.125e9 / (25e9 * 0.9))."""
    dev = multi_node_device("a100x8-hdr", 2)
    assert dev.count == 16
    from aisim.specs import load_calibration

    t = collective_s("all_reduce", 1e9, 16, dev, load_calibration(dev.gpu.name), 8)
    expected = 2 * (25e-6 + 7 / 8 * 1e9 / 230e9) + (30e-6 + 0.125e9 / 22.5e9)
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
    assert four.memory.total_gb == pytest.approx(one.memory.total_gb)


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
    assert any(r["name"].startswith("nccl.reduce_scatter") for r in data["top_ops"])
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
