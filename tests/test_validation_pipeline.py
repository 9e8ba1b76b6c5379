"""The measurement pipeline on the CPU: suite -> run_suite -> JSONL -> report, and TP sharding with gloo.

Tiny models (2 layers, hidden 64) keep this fast; no GPU is needed (energy and memory are then n/a).
"""
from __future__ import annotations

import csv
import io
import json
import socket
from pathlib import Path

import pytest
from aisim_path import ensure_aisim

ROOT = Path(__file__).resolve().parents[1]


AISIM_INSTALLED = ensure_aisim()

from aisim.validation.report import (  # noqa: E402
    ComparisonRow, Pair, aisim_device_name, build_report, render_report, summarize,
)
from aisim.validation.runner import RunError, read_jsonl, run_suite  # noqa: E402
from aisim.validation.suite import Case, MeasureSettings, expand_entry, load_suite  # noqa: E402
from aisim.validation.tables import Column, render_csv, render_markdown, render_rst_grid  # noqa: E402

TINY = {
    "llama": {"model_type": "llama", "_name_or_path": "tiny-llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 256, "tie_word_embeddings": False},
    "opt": {"model_type": "opt", "_name_or_path": "tiny-opt", "hidden_size": 64, "ffn_dim": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256,
            "word_embed_proj_dim": 64, "do_layer_norm_before": True, "enable_bias": True},
    "bloom": {"model_type": "bloom", "_name_or_path": "tiny-bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4,
              "vocab_size": 1000},
    "mixtral": {"model_type": "mixtral", "_name_or_path": "tiny-mixtral", "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
                "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256},
    "qwen2_moe": {"model_type": "qwen2_moe", "_name_or_path": "tiny-qwen2-moe", "hidden_size": 64,
                  "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                  "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 256},
}
FAST = {"warmup": 1, "min_trials": 2, "min_time_s": 0.0, "energy_min_s": 0.0}


@pytest.fixture
def configs(tmp_path) -> dict[str, str]:
    paths = {}
    for name, config in TINY.items():
        path = tmp_path / f"tiny-{name}.json"
        path.write_text(json.dumps(config))
        paths[name] = str(path)
    return paths


def _write_suite(tmp_path: Path, cases: list[dict], settings: dict = FAST) -> Path:
    import yaml

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "cpu", "settings": settings, "cases": cases}))
    return path


# ------------------------------------------------------------------ suite

def test_suite_entries_expand_to_cases_with_stable_keys():
    cases = expand_entry({"model": "m", "workload": ["forward", "decode"], "dtype": "fp16",
                          "shapes": [[1, 128], [8, 1024]]})
    assert len(cases) == 4  # 2 workloads x 2 shapes
    case = Case(**cases[3])
    assert case.key == "m/decode/b8/s1024/fp16/tp1"
    assert case.tokens == 8                      # a decode step: one token per row
    assert Case(model="m", batch=8, seq=1024).tokens == 8 * 1024


def test_a_case_with_experts_split_by_index_has_its_own_key_and_group():
    case = Case(model="m", workload="decode", tp=2, ep=2, dtype="bf16")
    assert case.key.endswith("/tp2/ep2") and case.group[-1] == 2
    assert Case(model="m", tp=2).key.endswith("/tp2")
    with pytest.raises(ValueError, match="ep 3 must be 1 or the tp degree"):
        Case(model="m", tp=2, ep=3)


def test_shipped_suites_load():
    h100 = load_suite(ROOT / "validation/suites/h100.yaml")
    tp2 = load_suite(ROOT / "validation/suites/tp2.yaml")
    assert 50 <= len(h100.cases) <= 70
    assert {c.tp for c in tp2.cases} == {1, 2}
    assert all(c.tp == 1 for c in h100.cases)
    tp4 = load_suite(ROOT / "validation/suites/tp4.yaml")
    assert {c.tp for c in tp4.cases} == {1, 4} and tp4.cases[-1].model == "Llama-2-70b-hf"   # the 70B last
    whisper = load_suite(ROOT / "validation/suites/whisper.yaml")
    assert {c.workload for c in whisper.cases} == {"encode", "decode"} and any(c.step_tokens > 1 for c in whisper.cases)
    # the tiny TP sweeps (derive_collective_host): every TP > 1 case has its TP 1 twin, and the configs resolve
    for name, degrees in (("tp-tiny", {1, 2}), ("tp-tiny4", {1, 2, 4})):
        suite = load_suite(ROOT / f"validation/suites/{name}.yaml")
        assert {c.tp for c in suite.cases} == degrees
        twins = {(c.model, c.workload, c.batch, c.seq) for c in suite.cases if c.tp == 1}
        assert all((c.model, c.workload, c.batch, c.seq) in twins for c in suite.cases)
        assert all((ROOT / c.model).is_file() for c in suite.cases)


# ------------------------------------------------------------------ runner, end to end on the CPU

def test_run_suite_records_every_case_and_goes_on_after_a_failure(tmp_path, configs):
    suite = _write_suite(tmp_path, [
        {"model": configs["llama"], "workload": ["forward", "prefill", "decode"], "dtype": "fp32",
         "batch": 2, "seq": 8},
        {"model": "no-such-model-xyz", "workload": "forward", "dtype": "fp32", "batch": 1, "seq": 8},
        {"model": configs["llama"], "workload": ["forward-backward", "train"], "dtype": "fp32",
         "batch": 1, "seq": 8},
    ])
    out = tmp_path / "out.jsonl"
    counts = run_suite(suite, out, device_name="cpu", progress=False)
    assert counts["ok"] == 5 and counts["error"] == 1
    lines = read_jsonl(out)
    assert lines[0]["type"] == "header" and lines[0]["gpu_name"] == "cpu"
    for field in ("driver", "cuda", "torch", "transformers", "power_limit_w", "date", "hostname", "aisim_version"):
        assert field in lines[0]
    cases = [line for line in lines if line["type"] == "case"]
    assert len(cases) == 6
    failed = [c for c in cases if c["status"] == "error"]
    assert len(failed) == 1 and "no-such-model-xyz" in failed[0]["error"]
    assert failed[0]["runtime_ms_median"] is None
    for c in cases:
        assert c["energy_available"] is False and c["energy_j_per_token"] is None   # never zero
        if c["status"] == "ok":
            assert c["runtime_ms_median"] > 0 and c["trials"] >= 2
            assert c["peak_memory_gb"] is None                                     # no CUDA allocator here
            assert c["throughput_tokens_per_s"] == pytest.approx(
                c["tokens"] / (c["runtime_ms_median"] / 1e3))
    decode = next(c for c in cases if c["workload"] == "decode")
    assert decode["tokens"] == 2 and decode["kv_fill"] == "prefill"

    # a rerun skips the finished cases and retries only the failed one
    again = run_suite(suite, out, device_name="cpu", progress=False)
    assert again["ok"] == 0 and again["error"] == 1 and again["already_done"] == 5
    # another GPU's name: a clear error, unless a new section is asked for
    with pytest.raises(RunError, match="another --out"):
        run_suite(suite, out, device_name="NVIDIA H100 80GB HBM3", progress=False)


def test_forced_exception_is_recorded_and_the_next_case_runs(tmp_path, configs, monkeypatch):
    import aisim.validation.measure as measure

    real = measure.measure_case

    def flaky(bm, case, settings):
        if case.workload == "prefill":
            raise RuntimeError("forced failure")
        return real(bm, case, settings)

    monkeypatch.setattr(measure, "measure_case", flaky)
    suite = _write_suite(tmp_path, [{"model": configs["opt"], "workload": ["prefill", "forward"],
                                     "dtype": "fp32", "batch": 1, "seq": 8}])
    out = tmp_path / "out.jsonl"
    run_suite(suite, out, device_name="cpu", progress=False)
    by_workload = {c["workload"]: c for c in read_jsonl(out) if c["type"] == "case"}
    assert by_workload["prefill"]["status"] == "error"
    assert by_workload["prefill"]["error"] == "RuntimeError: forced failure"
    assert by_workload["forward"]["status"] == "ok"


def test_time_budget_stops_cleanly(tmp_path, configs):
    suite = _write_suite(tmp_path, [{"model": configs["llama"], "workload": "forward", "dtype": "fp32",
                                     "batch": 1, "seq": 8}])
    counts = run_suite(suite, tmp_path / "out.jsonl", max_minutes=0, device_name="cpu", progress=False)
    assert counts["stopped_by_budget"] and counts["ok"] == 0
    assert not (tmp_path / "out.jsonl").exists() or read_jsonl(tmp_path / "out.jsonl") == []


# ------------------------------------------------------------------ report

def _row(workload="forward", tp=1, status="ok", runtime=(110.0, 100.0), memory=(9.0, 10.0),
         energy=(None, None), throughput=(1000.0, 1100.0)) -> ComparisonRow:
    metrics = {"runtime_ms": Pair(*runtime), "memory_gb": Pair(*memory), "energy_j_per_token": Pair(*energy),
               "throughput_tokens_per_s": Pair(*throughput)}
    return ComparisonRow(f"m/{workload}", "opt-1.3b", "NVIDIA H100 80GB HBM3", "h100-sxm", workload, 16, 1024,
                         "fp16", tp, status, metrics)


def test_error_and_mape_arithmetic():
    assert Pair(estimated=110.0, measured=100.0).error == pytest.approx(0.10)     # (110 - 100) / 100
    assert Pair(estimated=80.0, measured=100.0).error == pytest.approx(-0.20)
    assert Pair(estimated=None, measured=100.0).error is None
    rows = [_row(runtime=(110.0, 100.0)), _row(runtime=(80.0, 100.0)), _row(runtime=(None, 100.0))]
    summary = {s.category: s for s in summarize(rows)}
    forward = summary["forward/prefill runtime"]
    assert forward.n == 2 and forward.missing == 1
    assert forward.mape_pct == pytest.approx(15.0)          # (10 + 20) / 2
    assert forward.max_abs_error_pct == pytest.approx(20.0)
    assert summary["energy per token"].n == 0 and summary["energy per token"].mape_pct is None
    assert summary["peak memory"].mape_pct == pytest.approx(10.0)  # (9 - 10) / 10
    assert summary["tp runtime"].n == 0


def test_report_renders_rst_markdown_csv_json():
    rows = [_row(), _row(tp=2), _row(workload="decode", status="oom", runtime=(5.0, None))]
    rst = render_report(rows, "rst")
    tables = [block for block in rst.split("\n\n") if block.startswith("+")]
    assert len(tables) >= 3
    for table in tables:
        assert len({len(line) for line in table.splitlines()}) == 1   # every line of a grid has one width
    assert "+10.00%" in rst and "n/a" in rst and "NVIDIA H100 80GB HBM3 x 2" in rst
    assert "opt-1.3b (oom)" in rst
    assert "Measured | Estimated |" in rst.replace("  ", " ").replace("  ", " ")

    md = render_report(rows, "markdown", layout="flat")
    assert "| Runtime (ms) Measured | Runtime (ms) Estimated | Runtime (ms) Error |" in md

    parsed = list(csv.DictReader(io.StringIO(render_report(rows, "csv"))))
    assert len(parsed) == 3
    assert float(parsed[0]["Runtime (ms) Error (%)"]) == pytest.approx(10.0)
    assert parsed[0]["Energy (J/token) Measured"] == "n/a"

    data = json.loads(render_report(rows, "json"))
    assert data["rows"][0]["runtime_ms_error"] == pytest.approx(0.10)
    assert data["rows"][0]["energy_j_per_token_measured"] is None


def test_build_report_joins_jsonl_with_an_injected_estimator(tmp_path):
    lines = [{"type": "header", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 2},
             {"type": "case", "key": "opt-6.7b/forward/b16/s1024/fp16/tp1", "model": "opt-6.7b",
              "workload": "forward", "batch": 16, "seq": 1024, "dtype": "fp16", "tp": 1, "tp_scope": "all",
              "status": "ok", "runtime_ms_median": 100.0, "peak_memory_gb": 20.0, "energy_j_per_token": 0.02,
              "throughput_tokens_per_s": 163840.0},
             {"type": "case", "key": "opt-6.7b/forward/b16/s1024/fp16/tp2", "model": "opt-6.7b",
              "workload": "forward", "batch": 16, "seq": 1024, "dtype": "fp16", "tp": 2, "tp_scope": "all",
              "status": "oom", "runtime_ms_median": None}]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    calls = []

    def estimator(**kwargs):
        calls.append(kwargs)
        return {"runtime_ms": 110.0, "memory_gb": 21.0, "energy_j_per_token": 0.018,
                "throughput_tokens_per_s": 148945.45, "fits": True}

    data = json.loads(build_report([path], "json", estimator=estimator))
    assert [c["device"] for c in calls] == ["h100-sxm", "h100-sxmx2"]
    assert calls[1]["tp"] == 2 and calls[0]["workload"] == "forward"
    ok, oom = data["rows"]
    assert ok["runtime_ms_error"] == pytest.approx(0.10) and ok["memory_gb_error"] == pytest.approx(0.05)
    assert oom["runtime_ms_measured"] is None and oom["runtime_ms_error"] is None
    assert "n/a" in build_report([path], "rst", estimator=estimator)


def test_measured_gpu_names_map_to_aisim_devices():
    assert aisim_device_name("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert aisim_device_name("NVIDIA H200", 2) == "h200x2"
    try:
        from aisim.catalog import resolve_device
    except ImportError:
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert resolve_device(aisim_device_name("NVIDIA H100 80GB HBM3", 2)).count == 2


def test_generic_tables_have_aligned_grids():
    columns = [Column("Model", align="left"), Column("Runtime (ms)", ("Measured", "Estimated", "Error"))]
    rows = [["opt-1.3b", "693.77", "740.79", "+6.78%"], ["a-much-longer-model-name", "1.00", "n/a", "n/a"]]
    grid = render_rst_grid(columns, rows).splitlines()
    assert len({len(line) for line in grid}) == 1
    assert grid[0].count("+") == 5 and set(grid[4]) == {"+", "="}          # 4 leaves; '=' under the sub-titles
    assert "Runtime (ms)" in grid[1] and grid[1].count("|") == 3           # the group title spans 3 leaves
    assert "Measured" in grid[3]
    narrow = render_rst_grid([Column("A very long group title", ("x", "y"))], [["1", "2"]]).splitlines()
    assert len({len(line) for line in narrow}) == 1
    assert render_markdown(columns, rows).splitlines()[1] == "| :--- | ---: | ---: | ---: |"
    assert list(csv.reader(io.StringIO(render_csv(columns, rows))))[0][1] == "Runtime (ms) Measured"
    with pytest.raises(ValueError, match="leaves"):
        render_rst_grid(columns, [["too", "few"]])


# ------------------------------------------------------------------ tensor parallelism on the CPU (gloo)

def _tp_worker(rank: int, world: int, config_paths: list[str], port: int, out_dir: str) -> None:
    """Spawned rank: build each model sharded, save logits of a prefill, a decode step and the loss."""
    import torch
    import torch.distributed as dist

    ensure_aisim()
    from aisim.validation.measure import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for i, item in enumerate(config_paths):
            path, ep = item if isinstance(item, (list, tuple)) else (item, 1)
            _save_outputs(build_model(path, "fp32", torch.device("cpu"), rank=rank, world=world, ep=ep), rank,
                          Path(out_dir) / f"{i}.pt")
    finally:
        dist.destroy_process_group()


def _outputs(model, backward: bool) -> dict:
    """Prefill logits, one cached decode step's logits and the LM loss on fixed inputs."""
    import torch

    ids = torch.randint(0, 1000, (2, 10), generator=torch.Generator().manual_seed(1))
    new = torch.randint(0, 1000, (2, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        step = model(input_ids=new, past_key_values=out.past_key_values, use_cache=True)
    with torch.set_grad_enabled(backward):
        loss = model(input_ids=ids, labels=ids).loss
    grad = None
    if backward:
        loss.backward()   # the all-reduces of the backward pass must not hang or fail
        # a replicated weight's gradient is whole on every rank only if every split block's backward all-reduced
        # what it must (hidden states; a MoE's routing weights too)
        grad = model.get_input_embeddings().weight.grad.detach().clone()
    return {"logits": out.logits, "step": step.logits, "loss": loss.detach(), "embed_grad": grad}


def _save_outputs(bm, rank: int, path: Path) -> None:
    import torch

    outputs = _outputs(bm.model, backward=True)
    if rank == 0:
        torch.save(outputs, path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp2_sharded_logits_match_the_unsharded_model(tmp_path, configs):
    import torch
    import torch.multiprocessing as mp

    from aisim.validation.measure import build_model

    # GQA llama, OPT, BLOOM (fused per-head qkv, ALiBi), MoE experts as 3D parameters (Mixtral; Qwen2-MoE with a
    # gated shared expert)
    order = ["llama", "opt", "bloom", "mixtral", "qwen2_moe", "mixtral"]
    # the last: Mixtral's experts split by index (expert parallelism over the two ranks), not by width
    items = [configs[k] for k in order[:-1]] + [(configs["mixtral"], 2)]
    for attempt in range(2):  # a worker killed by the process group's start-up or teardown gets one more try
        try:
            mp.start_processes(_tp_worker, args=(2, items, _free_port(), str(tmp_path)),
                               nprocs=2, join=True, start_method="spawn")
            break
        except mp.ProcessExitedException:
            if attempt == 1:
                raise
        except Exception as exc:  # noqa: BLE001
            if "gloo" in str(exc).lower() or "connect" in str(exc).lower():
                pytest.skip(f"gloo process group could not start in this sandbox: {exc}")
            raise
    for i, name in enumerate(order):
        bm = build_model(configs[name], "fp32", torch.device("cpu"))
        got = torch.load(tmp_path / f"{i}.pt")
        want = _outputs(bm.model, backward=False)
        assert (got["logits"] - want["logits"]).abs().max() < 1e-4, name
        assert (got["step"] - want["step"]).abs().max() < 1e-4, name
        assert abs(got["loss"] - want["loss"]) < 1e-5, name
        bm.model.zero_grad(set_to_none=True)
        reference = _outputs(bm.model, backward=True)["embed_grad"]
        assert (got["embed_grad"] - reference).abs().max() < 1e-5, name


def test_shard_model_splits_weights_and_heads(configs):
    import torch

    from aisim.validation.measure import build_model
    from aisim.validation.tp import shard_model

    bm = build_model(configs["llama"], "fp32", torch.device("cpu"))
    shard_model(bm.model, rank=1, world=2)
    layer = bm.model.model.layers[0]
    assert layer.self_attn.q_proj.weight.shape == (32, 64)    # 4 heads x 16 -> 2 heads per rank
    assert layer.self_attn.k_proj.weight.shape == (16, 64)    # 2 kv heads -> 1 per rank
    assert layer.self_attn.o_proj.weight.shape == (64, 32)
    assert layer.mlp.down_proj.weight.shape == (64, 64)       # intermediate 128 / 2
    mlp_only = build_model(configs["opt"], "fp32", torch.device("cpu"))
    shard_model(mlp_only.model, rank=0, world=2, scope="mlp")
    opt_layer = mlp_only.model.model.decoder.layers[0]
    assert opt_layer.fc1.weight.shape == (64, 64) and opt_layer.self_attn.q_proj.weight.shape == (64, 64)
    assert opt_layer.fc2.bias is not None                     # rank 0 keeps the row-parallel bias
    with pytest.raises(ValueError, match="divide"):
        shard_model(build_model(configs["llama"], "fp32", torch.device("cpu")).model, rank=0, world=3)
    moe = build_model(configs["mixtral"], "fp32", torch.device("cpu"))
    experts = moe.model.model.layers[0].mlp.experts
    gate_up, down = experts.gate_up_proj.detach().clone(), experts.down_proj.detach().clone()
    shard_model(moe.model, rank=1, world=2)
    assert experts.gate_up_proj.shape == (4, 96, 64) and experts.down_proj.shape == (4, 64, 48)
    # rank 1 keeps intermediate features 48..95 of the gate half and of the up half, and those columns of down
    assert torch.equal(experts.gate_up_proj[:, :48], gate_up[:, 48:96])
    assert torch.equal(experts.gate_up_proj[:, 48:], gate_up[:, 144:])
    assert torch.equal(experts.down_proj, down[:, :, 48:])
    assert moe.model.model.layers[0].mlp.gate.weight.shape == (4, 64)    # the router stays whole
    ep = build_model(configs["mixtral"], "fp32", torch.device("cpu"))
    experts = ep.model.model.layers[0].mlp.experts
    gate_up = experts.gate_up_proj.detach().clone()
    shard_model(ep.model, rank=1, world=2, experts_by_index=True)
    assert experts.gate_up_proj.shape == (2, 192, 64) and experts.num_experts == 2   # experts 2 and 3, whole
    assert torch.equal(experts.gate_up_proj, gate_up[2:])


@pytest.mark.skipif(not AISIM_INSTALLED, reason="spawned TP workers import aisim: needs `pip install -e .`")
def test_run_suite_tp2_on_cpu(tmp_path, configs):
    suite = _write_suite(tmp_path, [{"model": configs["llama"], "workload": ["forward", "decode"],
                                     "dtype": "fp32", "tp": 2, "batch": 2, "seq": 8}])
    counts = run_suite(suite, tmp_path / "out.jsonl", device_name="cpu", progress=False)
    assert counts["ok"] == 2
    cases = [c for c in read_jsonl(tmp_path / "out.jsonl") if c["type"] == "case"]
    assert all(c["tp_impl"] == "plain-sharded-allreduce-hooks" for c in cases)


def test_settings_validate():
    with pytest.raises(ValueError):
        MeasureSettings(warmup=0)
    with pytest.raises(ValueError):
        Case(model="m", workload="decode", seq=1)


def test_decode_energy_with_large_untimed_work_is_not_compared():
    from aisim.validation.report import measured_energy_valid

    # window = 30.36 * 31 + 340 = 1281 J, of which 340 J (26.5%) were untimed cache copies
    assert not measured_energy_valid({"energy_after_work_j": 340.0, "energy_j_per_step": 30.36, "trials": 31})
    # 13.3 / (4.46 * 48 + 13.3) = 5.8%
    assert measured_energy_valid({"energy_after_work_j": 13.3, "energy_j_per_step": 4.46, "trials": 48})
    assert measured_energy_valid({"energy_j_per_step": 1.0, "trials": 10})


def test_encoder_decoder_cases_run_on_the_cpu(tmp_path):
    whisper = {"model_type": "whisper", "_name_or_path": "tiny-whisper", "architectures":
               ["WhisperForConditionalGeneration"], "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
               "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
               "decoder_ffn_dim": 128, "vocab_size": 1000, "num_mel_bins": 80, "max_source_positions": 1500,
               "max_target_positions": 448, "is_encoder_decoder": True, "pad_token_id": 0, "bos_token_id": 1,
               "eos_token_id": 2, "decoder_start_token_id": 3}
    path = tmp_path / "tiny-whisper.json"
    path.write_text(json.dumps(whisper))
    suite = _write_suite(tmp_path, [
        {"model": str(path), "workload": "encode", "dtype": "fp32", "batch": 1, "seq": 1},
        {"model": str(path), "workload": "decode", "dtype": "fp32", "batch": [1, 5], "seq": 40},
        {"model": str(path), "workload": "decode", "dtype": "fp32", "batch": 1, "seq": 30, "step_tokens": 30},
    ])
    out = tmp_path / "out.jsonl"
    counts = run_suite(suite, out, device_name="cpu", progress=False)
    assert counts["ok"] == 4, read_jsonl(out)
    cases = [line for line in read_jsonl(out) if line["type"] == "case"]
    prompt = next(c for c in cases if c["step_tokens"] == 30)
    assert prompt["key"].endswith("/s30/q30/fp32/tp1") and prompt["tokens"] == 30
    from aisim.validation.report import compare, load_measurements

    import aisim

    rows = compare(load_measurements([out]), lambda **kw: aisim.estimate(**{**kw, "device": "h100"}))
    assert all(r.estimate_error is None for r in rows), [r.estimate_error for r in rows]
    assert {r.workload for r in rows} == {"encode", "decode"}


def test_rst_grid_rule_sits_under_the_last_header_row():
    columns = [Column("Model", align="left"), Column("Runtime", ("measured", "error"))]
    text = render_rst_grid(columns, [["m", "1.0", "+2.00%"]])
    lines = text.splitlines()
    assert "measured" in lines[3] and set(lines[4]) <= {"+", "="}   # border, titles, border, subs, ===
    csv_text = render_csv(columns, [["m", "1,234.5", "+2.00%"], ["n", "n/a", "n/a"]])
    assert csv_text.splitlines() == ["Model,Runtime measured,Runtime error (%)", "m,1234.5,+2.00", "n,n/a,n/a"]
