"""`aisim serve` end to end: the scenario's step costs drive the request-level simulator."""
import json

from typer.testing import CliRunner

from aisim.cli import app
from aisim.scenario import scenario
from aisim.studies.serve import ServeRequest
from aisim.studies.serve.run import engine_config, serve
from aisim.studies.serve.steptime import BatchShape
from aisim.studies.serve.timer import StepCostTimer

runner = CliRunner()


def test_serve_json_has_vllm_metric_names():
    r = runner.invoke(app, ["serve", "--model", "opt-125m", "--device", "h100", "--num-requests", "40", "--rate",
                            "20", "--input-len", "uniform:32:256", "--output-len", "16", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    m = out["metrics"]
    for key in ("request_throughput", "output_throughput", "total_token_throughput", "median_ttft_ms",
                "p99_ttft_ms", "median_tpot_ms", "p90_itl_ms", "median_e2el_ms", "energy_j_per_output_token",
                "kv_cache_peak_utilization", "num_preemptions"):
        assert key in m, key
    assert m["completed"] == 40 and m["output_throughput"] > 0


def test_replicas_fill_the_device_and_never_lower_throughput():
    one = runner.invoke(app, ["serve", "--model", "opt-125m", "--device", "h100", "--num-requests", "60",
                              "--output-len", "32", "--input-len", "128", "--json"])
    two = runner.invoke(app, ["serve", "--model", "opt-125m", "--device", "h100x2", "--num-requests", "60",
                              "--output-len", "32", "--input-len", "128", "--json"])
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    a, b = json.loads(one.output), json.loads(two.output)
    assert b["replicas"] == 2
    assert b["metrics"]["output_throughput"] >= a["metrics"]["output_throughput"]


def test_step_time_grows_with_the_batch_and_at_low_rate_ttft_is_one_prefill():
    sc = scenario("opt-125m", "h100", dtype="bf16", runtime="transformers-cb")
    timer = StepCostTimer(sc, 8192)
    small = timer.step_time_s(BatchShape(0, 0.0, 0, 1, 512.0))
    big = timer.step_time_s(BatchShape(0, 0.0, 0, 64, 64 * 512.0))
    assert big > small > 0
    prefill = timer.step_time_s(BatchShape(256, 256.0 * 256, 1, 0, 0.0, 256.0))
    run, _, _ = serve(sc, ServeRequest(num_requests=5, input_len="256", output_len="8", rate_per_s=0.01))
    assert abs(run.result.median_ttft_ms / 1e3 - prefill) / prefill < 0.01


def test_engine_config_takes_its_defaults_from_the_runtime_profile_and_kv_from_memory():
    sc = scenario("Meta-Llama-3-8B", "h100", dtype="bf16", runtime="transformers-cb")
    cfg, cap = engine_config(sc, {})
    assert cfg.block_size == 256 and cfg.max_num_batched_tokens == 8192
    # 2 x 32 layers x 8 kv heads x 128 x 2 bytes = 131,072 bytes of K and V per token
    assert cap.bytes_per_token == 131072
    assert 1000 < cfg.num_kv_blocks < 2000
    big, _ = engine_config(sc, {"gpu_memory_utilization": 0.5})
    assert big.num_kv_blocks < cfg.num_kv_blocks


def test_serve_refuses_a_runtime_without_an_engine_profile():
    r = runner.invoke(app, ["serve", "--model", "opt-125m", "--device", "h100", "--runtime", "eager"])
    assert r.exit_code == 2 and "no continuous-batching engine profile" in r.output


def test_packed_attention_costs_repeat_kv_on_the_strided_copy_curve():
    """paged|sdpa's repeat_kv copies a non-contiguous view (PyTorch's generic elementwise copy kernel): the
    calibration's strided-operand curve, not the contiguous one."""
    from aisim.cost.efficiency import memory_efficiency

    sc = scenario("Meta-Llama-3-8B", "h100", dtype="bf16", runtime="transformers-cb")
    timer = StepCostTimer(sc, 8192)
    gpu, cal = sc.device.gpu, sc.calibration
    # 64 requests x 1025 keys = 65,600 keys; (8 kv + 32 query heads) x 128 x 2 bytes read + written per key
    copy = 65_600 * (8 + 32) * 128 * 2
    assert copy == 671_744_000
    strided = memory_efficiency(cal, copy, gpu, transposed=True)
    assert timer._memory_s(copy, strided=True) == copy / (gpu.memory_bw_bytes_per_s * strided)
    assert strided < 0.5 * memory_efficiency(cal, copy, gpu)


def test_packed_decode_step_within_10pct_of_the_h100_engine_profile():
    """validation/data/profiles/cb-Meta-Llama-3-8B-profile.txt: the engine's own step, 64 requests x 1024 context,
    107.5 ms (105.2 ms of kernels: cuDNN SDPA 47.2, the repeat_kv and contiguous copies 42.7, index_select 5.9)."""
    sc = scenario("Meta-Llama-3-8B", "h100", dtype="bf16", runtime="transformers-cb")
    timer = StepCostTimer(sc, 8192)
    shape = BatchShape(0, 0.0, 0, 64, 64 * 1025.0)
    forward_ms = 1e3 * (timer.step_time_s(shape) - timer._host_s(shape))
    assert abs(forward_ms / 107.5 - 1) < 0.10


def test_serve_cb_comparison_stays_under_its_regression_ceilings():
    """aisim.validation.serve_report: the six measured transformers-CB runs (H100) replayed through aisim serve."""
    from aisim.validation import serve_report

    assert serve_report.ceiling_violations() == []


def test_serve_cb_ceilings_trip_on_a_worse_comparison():
    from aisim.validation import serve_report

    worse = [{"error": {k: 0.5 for k, _ in serve_report.METRICS}}]   # every metric 50% off
    assert len(serve_report.ceiling_violations(worse)) == len(serve_report.METRICS)
    assert serve_report.ceiling_violations([]) == ["serve-cb: no measured runs"]


def test_split_kv_work_tiles_hand_worked():
    """FA3's dynamic split (hopper/flash_prepare_scheduler.cu), 132 SMs, head_dim 128 (128-key blocks)."""
    from aisim.studies.serve.timer import decode_work_tiles

    # 1 seq x 4096 keys = 32 key blocks; blocks_per_sm = ceil(32 x 1.1 x 8 / 132) = 3; splits = ceil(32 / 3) = 11
    assert decode_work_tiles(1, 4096, 8, 128, 132) == 8 * 11
    # 70B at tp 2: 4 kv heads; blocks_per_sm = ceil(32 x 1.1 x 4 / 132) = 2; splits = min(16, 16) = 16
    assert decode_work_tiles(1, 4096, 4, 128, 132) == 4 * 16
    # 64 seqs x 1024 keys: blocks_per_sm = ceil(512 x 1.1 x 8 / 132) = 35 > 8 blocks: no split
    assert decode_work_tiles(64, 1024, 8, 128, 132) == 64 * 8
    assert decode_work_tiles(1, 100, 8, 128, 132) == 8


def test_vllm_batch1_decode_step_agrees_with_estimate_at_long_context():
    """A batch-1 decode step of the serving timer (split-KV decode) against the step cost `estimate` charges for
    the same decode: within 3%, at a short and a long context (before split-KV: 7.2 and 41.6 ms vs 6.1 and 6.4)."""
    from aisim.step import step_cost
    from aisim.workload import StepShape

    sc = scenario("Meta-Llama-3-8B", "h100", dtype="bf16", runtime="vllm")
    timer = StepCostTimer(sc, 8192)
    for ctx in (128, 4096):
        serve_s = timer.step_time_s(BatchShape(0, 0.0, 0, 1, float(ctx)))
        estimate_s = step_cost(scenario("Meta-Llama-3-8B", "h100", dtype="bf16", runtime="vllm", phase="decode"),
                               StepShape(phase="decode", batch=1, seq=ctx)).runtime_s
        assert abs(serve_s / estimate_s - 1) < 0.03, (ctx, serve_s, estimate_s)
