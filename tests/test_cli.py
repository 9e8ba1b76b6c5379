"""The CLI as a user meets it: exit codes, JSON keys, errors without tracebacks (typer's CliRunner)."""
import json

import pytest
from typer.testing import CliRunner

from aisim.cli import app

runner = CliRunner()
JSON_KEYS = {"runtime_ms", "memory_gb", "energy_j", "energy_j_per_token", "throughput_tokens_per_s", "tokens", "fits"}


def run(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_estimate_json_has_the_stable_keys():
    r = run("estimate", "--model", "opt-125m", "--device", "h100", "--batch", "2", "--seq", "128", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert JSON_KEYS <= set(data)
    assert data["fits"] is True and data["tokens"] == 256
    assert data["runtime_ms"] > 0 and data["energy_j_per_token"] > 0
    assert data["throughput_tokens_per_s"] == pytest.approx(256 / (data["runtime_ms"] / 1e3))


def test_estimate_table_names_top_ops_and_the_default_plan():
    r = run("estimate", "--model", "opt-1.3b", "--device", "a6000x8", "--seq", "128")
    assert r.exit_code == 0, r.output
    assert "top ops by GPU time" in r.output and "default plan" in r.output and "nccl.all_reduce" in r.output


def test_generate_reports_ttft_and_tpot():
    r = run("estimate", "--model", "opt-125m", "--device", "h100", "--workload", "generate", "--seq", "64",
            "--gen", "16", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["ttft_ms"] > 0 and data["tpot_ms"] > 0
    assert data["runtime_ms"] == pytest.approx(data["ttft_ms"] + 15 * data["tpot_ms"])
    assert data["tokens"] == 16


def test_unknown_model_lists_close_matches_without_traceback():
    r = run("estimate", "--model", "opt-6.8b", "--device", "h100")
    assert r.exit_code == 2
    assert "unknown model 'opt-6.8b'" in r.output and "opt-6.7b" in r.output
    assert "Traceback" not in r.output


def test_unknown_device_lists_close_matches():
    r = run("estimate", "--model", "opt-125m", "--device", "a6000x8x")
    assert r.exit_code == 2 and "unknown device" in r.output
    r = run("estimate", "--model", "opt-125m", "--device", "h10")
    assert r.exit_code == 2 and "h100" in r.output


def test_default_plan_falls_back_to_data_parallel_where_tp_does_not_divide():
    r = run("estimate", "--model", "opt-125m", "--device", "h100x8", "--batch", "2", "--seq", "64", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["plan"] == {"tp": 4, "pp": 1, "dp": 2, "tp_scope": "all", "ep": 1,
                                            "moe_reduce_once": False, "kv_replicas": 1}


def test_plan_that_does_not_divide_names_the_dimension():
    r = run("estimate", "--model", "opt-125m", "--device", "h100x8", "--tp", "8")
    assert r.exit_code == 2 and "num_attention_heads = 12" in r.output
    r = run("estimate", "--model", "opt-125m", "--device", "h100x8", "--tp", "2", "--dp", "2")
    assert r.exit_code == 2 and "does not match the 8 GPU(s)" in r.output
    r = run("estimate", "--model", "opt-125m", "--device", "h100x8", "--tp", "3")
    assert r.exit_code == 2 and "does not divide the 8 GPUs" in r.output


def test_dp_is_inferred_from_the_gpus_left_over():
    # --device h100x2 --tp 1: two data-parallel replicas (GPUs / (tp x pp)), as Megatron and vLLM infer it
    r = run("estimate", "--model", "opt-125m", "--device", "h100x2", "--tp", "1", "--batch", "4", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["plan"] == {"tp": 1, "pp": 1, "dp": 2, "tp_scope": "all", "ep": 1, "moe_reduce_once": False,
                           "kv_replicas": 1}
    assert any("--dp not given: 2 data-parallel replicas" in a for a in out["assumptions"])


def test_bad_workload_is_a_clear_error():
    r = run("estimate", "--model", "opt-125m", "--device", "h100", "--workload", "fly")
    assert r.exit_code == 2 and "--workload" in r.output and "Traceback" not in r.output


def test_config_that_does_not_fit_says_so_with_numbers():
    r = run("estimate", "--model", "Llama-2-70b-hf", "--device", "rtx-a5000", "--seq", "128", "--json")
    assert r.exit_code == 1, r.output          # answered "no": exit status 1 (bad input is 2)
    data = json.loads(r.output)
    assert data["fits"] is False and data["runtime_ms"] is None
    assert "does not fit" in data["not_fit_reason"] and "GB" in data["not_fit_reason"]
    assert data["memory_gb"] > 130


def test_local_config_path(tmp_path):
    from aisim.catalog import resolve_model

    _, config = resolve_model("opt-125m")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    r = run("estimate", "--model", str(path), "--device", "l4", "--seq", "64", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["fits"]


def test_lists_and_trace():
    r = run("list", "models")
    assert r.exit_code == 0 and "facebook/opt-6.7b" in r.output and "openai/whisper-medium.en" in r.output
    r = run("list", "devices")
    assert r.exit_code == 0 and "rtx-a6000" in r.output and "a6000x8" in r.output
    r = run("trace", "--model", "gpt2", "--seq", "64")
    assert r.exit_code == 0 and "aten.addmm" in r.output


def test_tensor_parallel_decode_charges_only_the_step_collectives():
    r = run("estimate", "--model", "Llama-2-7b-hf", "--device", "h100x2", "--workload", "decode", "--batch", "4",
            "--seq", "1024", "--json")
    assert r.exit_code == 0, r.output
    comm = [o for o in json.loads(r.output)["top_ops"] if o["name"] == "nccl.all_reduce"]
    # 2 all-reduces per layer (32 layers) of one token per row: 4 x 4096 x 2 bytes each
    assert comm and comm[0]["count"] == 64 and comm[0]["bytes"] == pytest.approx(64 * 4 * 4096 * 2)


def test_pipeline_stages_wait_rather_than_double_the_energy():
    one = json.loads(run("estimate", "--model", "Llama-2-7b-hf", "--device", "h100", "--seq", "256", "--json").output)
    two = json.loads(run("estimate", "--model", "Llama-2-7b-hf", "--device", "h100x2", "--tp", "1", "--pp", "2",
                         "--seq", "256", "--json").output)
    # same work, done by two GPUs in turn: energy grows only by the waiting GPU's idle draw
    assert one["energy_j"] < two["energy_j"] < 1.5 * one["energy_j"]


def test_inference_pipeline_stage_holds_one_vocabulary_matrix():
    """Llama-2-7B (untied) on two GPUs under vLLM: a pipeline stage holds half the layers and the embedding or the
    LM head, as a tensor-parallel GPU holds half of everything (vocab-parallel): the same weights per GPU (pp 2
    held both vocabulary matrices, 0.26 GB more)."""
    args = ("--model", "Llama-2-7b-hf", "--device", "h100x2", "--workload", "decode", "--seq", "256", "--json",
            "--runtime", "vllm")
    pp = json.loads(run("estimate", *args, "--tp", "1", "--pp", "2").output)["memory"]["weights_gb"]
    tp = json.loads(run("estimate", *args, "--tp", "2").output)["memory"]["weights_gb"]
    assert pp == pytest.approx(tp, abs=0.01)


@pytest.mark.parametrize("args,text", [
    (["--workload", "generate", "--gen", "0"], "--gen: Input should be greater than or equal to 1"),
    (["--tp-scope", "foo"], "--tp-scope"),
    (["--workload", "encode"], "needs an encoder-decoder model"),
    (["--workload", "train", "--precision", "16-mixed", "--dtype", "bf16"], "conflicts with --precision 16-mixed"),
])
def test_more_bad_input_is_a_clear_error(args, text):
    r = run("estimate", "--model", "opt-125m", "--device", "h100", "--seq", "64", *args)
    assert r.exit_code == 2 and text in r.output and "Traceback" not in r.output


def test_weight_only_quantization_speeds_up_a_memory_bound_decode():
    base = json.loads(run("estimate", "--model", "Llama-2-7b-hf", "--device", "h100", "--workload", "decode",
                          "--batch", "1", "--seq", "512", "--runtime", "kernel-sum", "--json").output)
    int4 = json.loads(run("estimate", "--model", "Llama-2-7b-hf", "--device", "h100", "--workload", "decode",
                          "--batch", "1", "--seq", "512", "--runtime", "kernel-sum", "--quant", "int4",
                          "--json").output)
    # the weights are most of the bytes a batch-1 decode step moves; the KV cache and activations stay
    assert int4["runtime_ms"] < 0.6 * base["runtime_ms"]
    # linear weights at 0.5 byte, embeddings and head (2 x 32000 x 4096) kept in fp16
    assert int4["memory"]["weights_gb"] == pytest.approx(
        (base["memory"]["weights_gb"] * 1e9 - 2 * 32000 * 4096 * 2) / 4 / 1e9 + 2 * 32000 * 4096 * 2 / 1e9, rel=0.01)


def test_sequence_beyond_the_model_positions_is_refused():
    r = run("estimate", "--model", "opt-125m", "--device", "h100", "--seq", "100000")
    assert r.exit_code == 2 and "2048 positions" in r.output


@pytest.mark.parametrize("args, message", [
    (["--workload", "decode", "--gen", "999"], "--gen applies to --workload generate only"),
    (["--workload", "decode", "--with-loss"], "--with-loss applies to"),
    (["--workload", "decode", "--runtime", "graphs", "--kv-dtype", "fp8"], "StaticCache allocates K and V"),
    (["--workload", "train", "--batch", "8", "--pp-schedule", "interleaved"], "needs pipeline stages"),
    (["--workload", "train", "--batch", "8", "--virtual-stages", "4"], "applies to --pp-schedule interleaved"),
    (["--workload", "decode", "--virtual-stages", "4"], "applies to --workload train only"),
])
def test_options_a_workload_would_ignore_are_refused(args, message):
    """New-user test: these were accepted and silently did nothing."""
    result = runner.invoke(app, ["estimate", "--model", "Meta-Llama-3-8B", "--device", "h100", *args])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_weight_only_quant_keeps_the_lm_head_16_bit_and_streams_no_faster_than_a_copy():
    """--quant int4 reads the linear layers at 4 bits and the LM head at 16 (as the weight memory counts it: the
    head's GEMM costs what it does unquantized); replayed from a CUDA graph (vllm), no GEMM streams its bytes faster
    than the largest copies and adds of the calibration (stream_bandwidth_fraction, 0.905 on H100; it read 96% of
    H100's bandwidth before)."""
    import aisim
    from aisim import step
    from aisim.api import ScenarioRequest, build_request, resolve_scenario
    from aisim.workload import Workload

    costs = {}
    for quant in ("none", "int4"):
        sc = resolve_scenario(build_request(ScenarioRequest, model="Meta-Llama-3-8B", device="h100", dtype="bf16",
                                            runtime="vllm", quant=quant), "decode", 1)
        a = step.op_arrays(sc, Workload(phase="decode", batch=1, seq=640, dtype="bf16", quant=quant))
        costs[quant] = {op.scope: c for op, c in zip(a.ops, a.costs) if op.name == "aten.mm"}
    head = next(k for k in costs["none"] if k.endswith("lm_head"))
    assert costs["int4"][head] == costs["none"][head]
    down = next(k for k in costs["none"] if k.endswith("down_proj"))
    assert costs["int4"][down].bytes < 0.3 * costs["none"][down].bytes
    e = aisim.estimate("Meta-Llama-3-8B", "h100", workload="decode", batch=1, seq=640, dtype="bf16", runtime="vllm",
                       quant="int4")
    mm = next(o for o in e.top_ops if o.name == "aten.mm")
    cal = resolve_scenario(build_request(ScenarioRequest, model="Meta-Llama-3-8B", device="h100"), "decode").calibration
    assert cal.stream_bandwidth_fraction == pytest.approx(0.905)
    assert mm.bytes / (mm.time_ms / 1e3) <= 3.35e12 * 0.905 * 1.001


def test_the_title_names_the_weight_quantization():
    result = runner.invoke(app, ["estimate", "--model", "opt-125m", "--device", "h100", "--workload", "decode",
                                 "--quant", "fp8"])
    assert result.exit_code == 0 and "(fp8 weights)" in " ".join(result.output.split())


def test_the_api_refuses_gen_outside_generate_and_defaults_it_there():
    import aisim
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="--gen applies to --workload generate only"):
        aisim.estimate("opt-125m", "h100", workload="decode", gen=999)
    default = aisim.estimate("opt-125m", "h100", workload="generate", seq=64)
    assert default.runtime_ms == pytest.approx(aisim.estimate("opt-125m", "h100", workload="generate", seq=64,
                                                              gen=128).runtime_ms)


def test_help_in_a_narrow_terminal_or_a_pipe_wraps_instead_of_cropping_option_names():
    """rich's option table cropped names at 80-109 columns ('--max-num-batched…') and printed 80 columns into a
    pipe; a narrow terminal or a pipe gets click's help, which wraps."""
    import os
    import subprocess
    import sys

    for columns in ("80", "105", None):       # None: piped with no $COLUMNS
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
        out = subprocess.run([sys.executable, "-m", "aisim.cli", "serve", "--help"], capture_output=True, text=True,
                             env=env, check=True).stdout
        assert "--max-num-batched-tokens" in out and "--gpu-memory-utilization" in out and "…" not in out, columns
        assert max(len(line) for line in out.splitlines()) <= int(columns or 80), columns
