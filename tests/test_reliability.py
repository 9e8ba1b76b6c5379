"""Reliability: no code execution, no silent wrong answer, no traceback, no hang (the reliability issue).

Every input either gives a finite, positive answer with exit code 0, or a one-line error with exit code 2.
Table-driven tests cover the issue's classes of inputs; hypothesis fuzzes the CLI and API numbers, config files
and spec files. Small models only (opt-125m, gpt2, whisper-tiny and a tiny llama config): their traces are cached
after the first one.
"""
import json
import math
import os
import pickle
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import aisim
from aisim import catalog, specs
from aisim.cli import app
from aisim.errors import AisimError

DEV = "a100-sxm4-80gb"
# AISIM_FUZZ_EXAMPLES=500 for a longer hunt (random seeds); the default run is quick and repeatable
EXAMPLES = int(os.environ.get("AISIM_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=EXAMPLES or 25, deadline=None, suppress_health_check=list(HealthCheck),
                derandomize=not EXAMPLES)
runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def non_finite(data, where="result"):
    """The path of the first NaN/infinity in a JSON-like value, else None."""
    if isinstance(data, float) and not math.isfinite(data):
        return where
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    return next((f for k, v in items if (f := non_finite(v, f"{where}.{k}"))), None)


def check_estimate(data: dict) -> None:
    """An answer: finite everywhere, positive runtime, memory and energy where it fits."""
    assert non_finite(data) is None, non_finite(data)
    assert data["memory_gb"] > 0
    if data["fits"]:
        assert data["runtime_ms"] > 0 and data["energy_j"] > 0 and data["throughput_tokens_per_s"] > 0


def check_clean(r, expected: int | None = None) -> None:
    """Exit 0 or 2 (or ``expected``), never a traceback; exit 0 with JSON output passes check_estimate."""
    exc = r.exception if r.exception is not None and not isinstance(r.exception, SystemExit) else None
    assert exc is None, f"traceback: {exc!r}\n{r.output}"
    assert "Traceback" not in r.output
    assert r.exit_code in (0, 2), r.output
    if expected is not None:
        assert r.exit_code == expected, r.output
    out = r.stdout
    if r.exit_code == 0 and out.lstrip().startswith("{"):
        data = json.loads(out)
        assert "Infinity" not in out and "NaN" not in out
        if "runtime_ms" in data:
            check_estimate(data)


@pytest.fixture
def user_specs(tmp_path, monkeypatch):
    """An empty user spec directory; spec caches cleared before and after."""
    folder = tmp_path / "specs"
    for sub in ("gpus", "systems", "runtimes", "calibration"):
        (folder / sub).mkdir(parents=True)
    monkeypatch.setenv(specs.USER_SPECS_ENV, str(folder))
    specs.clear_caches()
    yield folder
    specs.clear_caches()


@pytest.fixture
def tiny_config(tmp_path, tiny_llama):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(tiny_llama))
    return path


# ------------------------------------------------------------------ the issue's classes, table-driven

E = ["estimate", "-m", "opt-125m", "-d", DEV, "--seq", "64", "--json"]
T = ["estimate", "-m", "whisper-tiny", "-d", DEV, "--workload", "transcribe", "--json"]
CLI_CASES = [
    # parallel degrees without --tp, zero and negative
    (E + ["--pp", "0"], 2), (E + ["--dp", "0"], 2), (E + ["--tp", "0"], 2),
    (["estimate", "-m", "opt-125m", "-d", f"{DEV}x2", "--pp", "-1"], 2),
    (["estimate", "-m", "opt-125m", "-d", f"{DEV}x2", "--dp", "-2"], 2),
    (["estimate", "-m", "opt-125m", "-d", f"{DEV}x2", "--tp", "5"], 2),
    # shapes out of range
    (E + ["--batch", "0"], 2), (E + ["--batch", "-3"], 2), (E[:-3] + ["--seq", "0", "--json"], 2),
    (E[:-3] + ["--seq", str(10**13), "--json"], 2), (E + ["--batch", str(10**12)], 2),
    (E + ["--workload", "decode", "--seq", "1"], 2), (E + ["--workload", "generate", "--gen", "0"], 2),
    # clocks and power limits, tiny, huge, NaN
    (E + ["--gpu-clock", "0.001"], 2), (E + ["--gpu-clock", "1e-300"], 2), (E + ["--gpu-clock", "5e-324"], 2),
    (E + ["--gpu-clock", "nan"], 2), (E + ["--gpu-clock", "inf"], 2), (E + ["--gpu-clock", "-100"], 2),
    (E + ["--gpu-clock", "1e9"], 2), (E + ["--power-limit", "0"], 2), (E + ["--power-limit", "nan"], 2),
    (E + ["--power-limit", "1e12"], 2), (E + ["--power-mode", "turbo"], 2),
    # names
    (["estimate", "-m", "", "-d", DEV], 2), (["estimate", "-m", "opt-6.8b", "-d", DEV], 2),
    (["estimate", "-m", "missing/config.json", "-d", DEV], 2), (["estimate", "-m", "opt-125m", "-d", ""], 2),
    (["estimate", "-m", "opt-125m", "-d", "h100x10000000000"], 2), (["estimate", "-m", "opt-125m", "-d", "h100x0"], 2),
    (["estimate", "-m", "opt-125m", "-d", "missing.yaml"], 2), (E + ["--dtype", "fp12"], 2),
    (E + ["--quant", "int3"], 2), (E + ["--tp-scope", "some"], 2), (E + ["--workload", "sing"], 2),
    (E + ["--runtime", "vllm9"], 2), (E + ["--calibration", "/nonexistent.yaml"], 2),
    # runtime and vendor
    (T + ["--audio-s", "60", "-d", "mi300x"], 2), (T + ["--audio-s", "60", "--runtime", "ggml-cuda", "-d", "mi300x"], 2),
    # transcribe bounds (these hung)
    (T + ["--audio-s", "1e12"], 2), (T + ["--audio-s", "60", "--windows", "1000000000"], 2),
    (T + ["--audio-s", "0"], 2), (T + ["--audio-s", "nan"], 2), (T + ["--audio-s", "-5"], 2),
    (T + ["--audio-s", "60", "--tokens", "100000"], 2), (T + ["--audio-s", "600", "--windows", "2"], 2),
    (["estimate", "-m", "opt-125m", "-d", DEV, "--workload", "transcribe", "--audio-s", "60"], 2),
    (E + ["--audio-s", "60"], 2), (T + ["--audio-s", "60", "--beam", "0"], 2),
    # other commands
    (["serve-bench", "-m", "opt-125m", "-d", DEV, "--shards", "0"], 2),
    (["serve-bench", "-m", "opt-125m", "-d", DEV, "--batch", "a,b"], 2),
    (["list", "gpus"], 0), (["list", "gadgets"], 2),   # gpus: an alias of devices
    # answers
    (E, 0), (E + ["--workload", "decode", "--seq", "2"], 0), (E + ["--workload", "generate", "--gen", "4"], 0),
    (E + ["--gpu-clock", "1410"], 0), (E + ["--gpu-clock", "141"], 0), (E + ["--workload", "forward-backward"], 0),
    (["estimate", "-m", "gpt2", "-d", DEV, "--seq", "64", "--quant", "int8", "--json"], 0),
    (["estimate", "-m", "opt-125m", "-d", f"{DEV}x2", "--seq", "64", "--tp-scope", "full", "--json"], 0),
    (T + ["--audio-s", "60"], 0), (T + ["--audio-s", str(366 * 24 * 3600)], 0),
    (["list", "models"], 0), (["list", "devices"], 0), (["list", "runtimes"], 0),
]


@pytest.mark.parametrize("args,code", CLI_CASES, ids=lambda v: " ".join(v[2:]) if isinstance(v, list) else None)
def test_cli_inputs_answer_or_refuse_in_one_line(args, code):
    check_clean(cli(*args), code)


CONFIGS = {  # config.json contents that must be refused in one line
    "list": [1, 2], "string": "llama", "number": 3, "null": None, "no model_type": {"hidden_size": 64},
    "unknown model_type": {"model_type": "nonesuch"}, "negative layers": {"num_hidden_layers": -2},
    "zero hidden": {"hidden_size": 0}, "string layers": {"num_hidden_layers": "4"},
    "float heads": {"num_attention_heads": 4.0}, "bool layers": {"num_hidden_layers": True},
    "huge vocab": {"vocab_size": 10**30}, "heads do not divide": {"num_attention_heads": 5},
    "name not a string": {"_name_or_path": 5, "num_hidden_layers": -1},
}


@pytest.mark.parametrize("name", CONFIGS)
def test_broken_config_files_are_refused(name, tmp_path, tiny_llama):
    content = CONFIGS[name]
    if isinstance(content, dict) and "model_type" not in content and name != "no model_type":
        content = {**tiny_llama, **content}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    check_clean(cli("estimate", "-m", path, "-d", DEV, "--seq", "16", "--json"), 2)


@pytest.mark.parametrize("raw", [b"\x80\x81\xfe\xff" * 10, b"[" * 100_000 + b"]" * 100_000, b"{\"a\": ", b""])
def test_binary_deep_or_torn_config_is_refused(raw, tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    check_clean(cli("estimate", "-m", path, "-d", DEV, "--json"), 2)
    check_clean(cli("estimate", "-m", tmp_path / "nothing_here", "-d", DEV), 2)   # a folder without config.json


def test_api_takes_a_path_and_refuses_wrong_types(tiny_config):
    assert aisim.estimate(model=tiny_config, device=DEV, seq=16).runtime_ms > 0
    for bad in ({"model": None}, {"dp": None, "tp": "2"}, {"power_limit_w": "300"}, {"batch": 1.5},
                {"seq": True}, {"device": 3}, {"top_ops": -1}, {"gpu_clock_mhz": float("nan")},
                {"audio_s": float("inf"), "workload": "transcribe"}):
        with pytest.raises(AisimError):
            aisim.estimate(**{"model": tiny_config, "device": DEV, "seq": 16, **bad})


# ------------------------------------------------------------------ code execution

def test_auto_map_config_cannot_run_its_code(tmp_path, tiny_llama):
    sentinel = tmp_path / "ran"
    (tmp_path / "modeling_evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('x')\n")
    (tmp_path / "config.json").write_text(json.dumps({**tiny_llama, "model_type": "evil",
                                                      "auto_map": {"AutoConfig": "modeling_evil.EvilConfig"}}))
    r = cli("estimate", "-m", tmp_path, "-d", DEV, "--seq", "16")
    check_clean(r, 2)
    assert "auto_map" in r.output and "model_type" in r.output and not sentinel.exists()


@pytest.mark.parametrize("dtype", ["banana", 16, "torch.bfloat16"])
def test_a_config_dtype_torch_does_not_have_is_one_line(tmp_path, tiny_llama, dtype):
    (tmp_path / "config.json").write_text(json.dumps({**tiny_llama, "torch_dtype": dtype}))
    r = cli("estimate", "-m", tmp_path, "-d", DEV, "--seq", "16", "--dtype", "auto")
    check_clean(r, 2)
    assert "torch_dtype" in r.output and "not a torch dtype" in r.output
    (tmp_path / "config.json").write_text(json.dumps({**tiny_llama, "torch_dtype": "bfloat16"}))
    assert cli("estimate", "-m", tmp_path, "-d", DEV, "--seq", "16").exit_code == 0
    # the key transformers 5 reads is checked (dtype over torch_dtype), and its per-sub-config dict form accepted
    catalog.check_config({**tiny_llama, "dtype": "bfloat16", "torch_dtype": "banana"}, "x")
    catalog.check_config({**tiny_llama, "dtype": {"text_config": "bfloat16", "vision_config": "float32"}}, "x")
    with pytest.raises(AisimError, match="not a torch dtype"):
        catalog.check_config({**tiny_llama, "dtype": {"text_config": "banana"}}, "x")


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_in_the_graph_cache_is_never_loaded(tmp_path, monkeypatch):
    from aisim.graph import cache

    sentinel = tmp_path / "ran"
    monkeypatch.setenv("AISIM_CACHE_DIR", str(tmp_path / "cache"))
    folder = cache.cache_dir()
    folder.mkdir(parents=True)
    payload = pickle.dumps(_Payload(str(sentinel)))
    inputs = cache.key_inputs({"model_type": "x"}, {}, {})
    key = cache.cache_key(inputs)
    for name in (f"{key}{cache.SUFFIX}", f"{key}.pkl", f"{key}.pickle"):
        (folder / name).write_bytes(payload)
    assert cache.load(key, inputs) is None and not sentinel.exists()
    r = cli("estimate", "-m", "gpt2", "-d", DEV, "--seq", "32", "--json")   # traces into a cache of pickles
    check_clean(r, 0)
    assert not sentinel.exists()


def test_a_filled_model_config_is_read_back_without_importing_transformers(tmp_path):
    """A new process resolving a model whose filled config is cached on disk neither imports transformers (seconds
    of a cached estimate) nor gets another config than the process that filled it."""
    import subprocess
    import sys

    env = dict(os.environ, AISIM_CACHE_DIR=str(tmp_path))
    code = ("import json, sys; from aisim.catalog import resolve_model; name, c = resolve_model('Qwen1.5-MoE-A2.7B'); "
            "print(json.dumps([name, c, 'transformers' in sys.modules], sort_keys=True))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout) for _ in range(2)]
    assert runs[0][2] and not runs[1][2]
    assert runs[0][:2] == runs[1][:2] and len(runs[0][1]["layer_types"]) == 24


def test_changing_a_graph_building_source_invalidates_the_cache(tmp_path, monkeypatch):
    from aisim.graph import cache

    root = Path(cache.__file__).resolve().parent.parent
    copy = tmp_path / "simulator"
    shutil.copytree(root / "graph", copy / "graph")
    for name in cache._CODE_FILES:
        shutil.copy(root / name, copy / name)
    monkeypatch.setattr(cache, "__file__", str(copy / "graph" / "cache.py"))
    monkeypatch.setenv("AISIM_CACHE_DIR", str(tmp_path / "cache"))
    cache.code_hash.cache_clear()
    try:
        inputs = cache.key_inputs({"model_type": "x"}, {"seq": 1}, {})
        graph = aisim.graph.ops.Graph(ops=[], repeats=[], param_count=1, param_bytes=2.0,
                                      peak_activation_bytes=0.0, persistent_bytes=0.0, layers=1, traced_layers=(1,),
                                      meta={})
        cache.store(cache.cache_key(inputs), inputs, graph)
        assert cache.load(cache.cache_key(inputs), inputs) is not None
        for source in (copy / "graph" / "tp_rules.py", copy / "workload.py"):
            source.write_text(source.read_text() + "\n# changed\n")
            cache.code_hash.cache_clear()
            fresh = cache.key_inputs({"model_type": "x"}, {"seq": 1}, {})
            assert fresh != inputs and cache.load(cache.cache_key(fresh), fresh) is None
            assert cache.load(cache.cache_key(inputs), fresh) is None   # same file name, other code: a miss
            inputs = fresh
    finally:
        cache.code_hash.cache_clear()


# ------------------------------------------------------------------ spec files

GOOD_GPU = yaml.safe_load((Path(specs.__file__).parent.parent / "hardware_specs" / "gpus" / "l4.yaml").read_text())
BAD_GPU_FIELDS = {"memory_bw_bytes_per_s": [-1.0, 0.0, float("nan"), float("inf"), "fast"],
                  "memory_bytes": [0, -5], "board_power_w": [-300, 0], "boost_clock_mhz": [0, float("nan")],
                  "sm_count": [0, 2.5], "peak_flops_per_s": [{"fp32": -1, "fp16": 1e12}, None, [1]]}


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in BAD_GPU_FIELDS.items() for v in vs])
def test_a_broken_gpu_file_names_its_field_and_is_skipped_in_listings(field, value, user_specs):
    path = user_specs / "gpus" / "broken.yaml"
    path.write_text(yaml.safe_dump({**GOOD_GPU, "name": "broken", "aliases": [], field: value}))
    r = cli("estimate", "-m", "opt-125m", "-d", path, "--seq", "16")
    check_clean(r, 2)
    assert field in r.output and "broken.yaml" in r.output
    check_clean(cli("list", "devices"), 0)
    check_clean(cli("estimate", "-m", "opt-125m", "-d", "l4", "--seq", "16", "--json"), 0)


@pytest.mark.parametrize("sub,content", [
    ("gpus", "- a list\n"), ("gpus", "\x00\x01 garbage: [\n"), ("systems", "name: s\ngpu: l4\ngpu_count: 0\n"),
    ("runtimes", "name: r\nper_step_overhead_s: -1\n"), ("calibration", "device: l4\nlaunch_overhead_s: nan\n"),
    ("gpus", yaml.safe_dump({**GOOD_GPU, "name": "l4-copy", "aliases": ["h100"]})),   # alias taken
])
def test_one_broken_spec_file_breaks_no_command(sub, content, user_specs):
    (user_specs / sub / ("l4.yaml" if sub == "calibration" else "bad.yaml")).write_text(content)
    for what in ("models", "devices", "runtimes"):
        check_clean(cli("list", what), 0)
    r = cli("estimate", "-m", "opt-125m", "-d", "h100-pcie", "--seq", "16", "--json")
    check_clean(r, 0)
    assert json.loads(r.output)["device"] == "h100-pcie"
    check_clean(cli("estimate", "-m", "opt-125m", "-d", "l4", "--seq", "16", "--json"),
                2 if sub == "calibration" else 0)   # a GPU's own broken calibration is an error, not a default


def test_a_broken_shipped_model_file_is_skipped(tmp_path, monkeypatch):
    shutil.copy(catalog._model_dir() / "gpt2.json", tmp_path / "gpt2.json")
    (tmp_path / "broken.json").write_text("[1, 2")
    (tmp_path / "evil.json").write_text(json.dumps({"model_type": "x", "auto_map": {"AutoConfig": "a.B"}}))
    monkeypatch.setattr(catalog, "_model_dir", lambda: tmp_path)
    catalog.model_index.cache_clear()
    try:
        with pytest.warns(UserWarning, match="broken.json"):
            catalog.model_index()
        check_clean(cli("list", "models"), 0)
        check_clean(cli("estimate", "-m", "gpt2", "-d", DEV, "--seq", "16", "--json"), 0)
    finally:
        catalog.model_index.cache_clear()


# ------------------------------------------------------------------ validation commands

def _suite(tmp_path, text="name: s\ncases:\n  - {model: opt-125m, batch: 1, seq: 16}\n"):
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", ["name: x\ncases: [1, 2\n", "cases: 5\n", "- 1\n- 2\n",
                                  "cases:\n  - {model: opt-125m, batch: a}\n", "cases:\n  - [1, 2]\n",
                                  "cases:\n  - {model: opt-125m, shapes: 3}\n", "\x00\x01"])
def test_malformed_suite_is_one_line(text, tmp_path):
    check_clean(cli("validate", _suite(tmp_path, text), "--out", tmp_path / "o.jsonl"), 2)


def test_validate_without_cuda_refuses_unless_asked(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    suite, out = _suite(tmp_path), tmp_path / "o.jsonl"
    r = cli("validate", suite, "--out", out)
    check_clean(r, 2)
    assert "CUDA" in r.output and not out.exists()
    for extra in (["--max-minutes", "-1"], ["--max-minutes", "nan"], ["--out", tmp_path]):
        check_clean(cli("validate", suite, "--out", out, *extra), 2)


def test_report_inputs(tmp_path):
    check_clean(cli("validate", "--report", tmp_path / "missing.jsonl"), 2)
    check_clean(cli("validate", "--report", tmp_path), 2)
    data = tmp_path / "d.jsonl"
    case = {"type": "case", "key": "k", "model": "opt-125m", "workload": "forward", "batch": 1, "seq": 16,
            "dtype": "fp16", "tp": 1, "status": "ok", "runtime_ms_median": -3.0}
    lines = [{"type": "header", "gpu_name": "NVIDIA A100-SXM4-80GB"}, case, [1, 2], "text", None, 5,
             {**case, "key": "k2", "runtime_ms_median": float("inf")}, {"type": "case"}]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n{torn")
    r = cli("validate", "--report", data, "--format", "json")
    check_clean(r, 0)
    body = r.stdout
    assert "Infinity" not in body and "NaN" not in body and json.loads(body)["rows"] == []


def test_a_torn_last_line_is_quarantined_before_appending(tmp_path):
    from aisim.validation.runner import _Writer, finished_keys, read_jsonl

    out = tmp_path / "m.jsonl"
    out.write_text(json.dumps({"type": "header", "gpu_name": "A"}) + "\n" +
                   json.dumps({"type": "case", "key": "k1", "status": "ok"}) + "\n" + '{"type": "case", "key": "k2"')
    writer = _Writer(out)
    writer.write({"type": "header", "gpu_name": "B"})
    writer.write({"type": "case", "key": "k2", "status": "ok"})
    writer.close()
    lines = read_jsonl(out)
    assert [x.get("gpu_name", x.get("key")) for x in lines] == ["A", "k1", "B", "k2"]
    assert finished_keys(lines, "B") == {"k2"} and finished_keys(lines, "A") == {"k1"}
    assert (tmp_path / "m.jsonl.torn").read_text().startswith('{"type": "case", "key": "k2"')


# ------------------------------------------------------------------ fuzz

SMALL_INT = st.one_of(st.sampled_from([1, 2]), st.integers(-10**18, 0), st.integers(10**7, 10**19))
CLOCK = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([141.0, 1410.0]))


@FUZZ
@given(batch=SMALL_INT, seq=st.one_of(st.sampled_from([16, 32]), SMALL_INT), pp=SMALL_INT, dp=st.none() | SMALL_INT,
       tp=st.none() | SMALL_INT, clock=CLOCK, limit=CLOCK, workload=st.sampled_from(
           ["forward", "prefill", "decode", "generate", "encode", "train", "transcribe"]),
       device=st.sampled_from([DEV, f"{DEV}x2", "mi300x", "l4"]))
def test_fuzz_api_numbers(tiny_llama_path, batch, seq, pp, dp, tp, clock, limit, workload, device):
    try:
        result = aisim.estimate(model=tiny_llama_path, device=device, workload=workload, batch=batch, seq=seq,
                                pp=pp, dp=dp, tp=tp, gpu_clock_mhz=clock, power_limit_w=limit, gen=4)
    except AisimError as exc:
        assert "\n" not in str(exc).strip()
        return
    check_estimate(result.model_dump())


@FUZZ
@given(flag=st.sampled_from(["--model", "--device", "--dtype", "--workload", "--runtime", "--tp-scope", "--quant",
                             "--calibration", "--power-mode", "--batch", "--seq", "--gpu-clock", "--audio-s"]),
       text=st.text(max_size=30))
def test_fuzz_cli_text(flag, text):
    args = {"--model": "opt-125m", "--device": DEV, "--seq": "16"}
    args[flag] = text
    check_clean(cli("estimate", *[x for kv in args.items() for x in kv], "--json"))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=3), max_leaves=10)


@FUZZ
@given(key=st.sampled_from(list(catalog.POSITIVE_INT_KEYS[:13]) + ["model_type", "architectures", "auto_map",
                                                                     "tie_word_embeddings", "rope_scaling"]),
       value=st.one_of(JSON, st.integers(1, 300)))
def test_fuzz_config_values(tiny_llama_path, key, value):
    config = json.loads(Path(tiny_llama_path).read_text())
    path = Path(tiny_llama_path).parent.parent / "fuzz" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**config, key: value}))
    check_clean(cli("estimate", "-m", path, "-d", DEV, "--seq", "16", "--json"))


@FUZZ
@given(field=st.sampled_from(sorted(set(GOOD_GPU) - {"sources", "name"})), value=JSON)
def test_fuzz_gpu_spec_values(gpu_dir, field, value):
    path = gpu_dir / "fuzz.yaml"
    path.write_text(yaml.safe_dump({**GOOD_GPU, "name": "fuzz", field: value}))
    check_clean(cli("estimate", "-m", "opt-125m", "-d", path, "--seq", "16", "--json"))


@pytest.fixture(scope="module")
def tiny_llama_path(tmp_path_factory):
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 512, "tie_word_embeddings": False}
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu")


def test_no_hang_on_the_longest_inputs():
    import time

    start = time.perf_counter()
    for args in (T + ["--audio-s", str(366 * 24 * 3600), "--windows", str(366 * 24 * 120)],
                 ["estimate", "-m", "opt-125m", "-d", "h100x100000", "--seq", "16", "--json"]):
        check_clean(cli(*args))
    assert time.perf_counter() - start < 60


# ------------------------------------------------------------------ the silent wrong answers of the issue, as invariants

def test_quantized_gpt2_weights_shrink_and_full_scope_keeps_the_tie():
    est = {q: aisim.estimate(model="gpt2", device=DEV, seq=32, quant=q).memory.weights_gb for q in ("none", "int8")}
    assert est["int8"] < 0.7 * est["none"]                      # Conv1D layers quantized like Linear ones
    gpt2 = {s: aisim.estimate(model="gpt2", device=f"{DEV}x2", seq=32, tp=2, tp_scope=s).memory.weights_gb
            for s in ("all", "full")}
    assert gpt2["full"] <= gpt2["all"]                          # a vocab-parallel head keeps the tie: never more


def test_step_tokens_apply_to_decode_only():
    with pytest.raises(AisimError, match="step-tokens"):
        aisim.estimate(model="opt-125m", device=DEV, seq=64, step_tokens=65)
    with pytest.raises(AisimError, match="step-tokens"):
        aisim.estimate(model="opt-125m", device=DEV, workload="decode", seq=4, step_tokens=5)


@pytest.mark.parametrize("script, argv", [
    ("derive_gemm_waves", ["{missing}"]),
    ("derive_power_mix", ["--check", "{missing}"]),
    ("derive_grouped_gemm", ["{missing}", "--gpu", "h100"]),
    ("derive_fp8_curve", ["{missing}"]),
    ("fit_masked_attention", []),
])
def test_derive_scripts_end_in_one_error_line(tmp_path, script, argv):
    """A derive script given a missing file (or too few arguments) prints one ``error:`` line and exits 2."""
    import subprocess
    import sys

    args = [a.format(missing=tmp_path / "missing.jsonl") for a in argv]
    proc = subprocess.run([sys.executable, "-m", f"aisim.validation.scripts.{script}", *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in proc.stderr


def test_derive_scripts_refuse_an_unknown_calibration():
    from aisim.validation.scripts.derive_power_mix import main

    with pytest.raises(SystemExit) as exc:
        main(["--calibration", "h100-typo"])
    assert exc.value.code == 2


def test_new_user_findings_of_session_24():
    """A V100 has no tf32 units: --dtype tf32 is fp32 there (time and energy); a one-token generate has no TPOT;
    an engine profile's memory policy bounds the batch estimate calls fitting."""
    from aisim import estimate

    kw = dict(model="Llama-2-7b-hf", device="v100", workload="prefill", seq=1024, top_ops=None)
    tf32, fp32 = estimate(dtype="tf32", **kw), estimate(dtype="fp32", **kw)
    assert tf32.runtime_ms == pytest.approx(fp32.runtime_ms) and tf32.energy_j == pytest.approx(fp32.energy_j)
    assert estimate(dtype="tf32", **{**kw, "device": "a100"}).runtime_ms < estimate(
        dtype="fp32", **{**kw, "device": "a100"}).runtime_ms    # an A100 has them
    one = estimate(model="Meta-Llama-3-8B", device="h100", workload="generate", seq=128, gen=1, runtime="vllm",
                   top_ops=None)
    assert one.tpot_ms == 0 and one.ttft_ms > 0
    big = dict(model="Meta-Llama-3-70B", device="h100", runtime="vllm", quant="fp8", workload="decode", seq=2048,
               top_ops=None)
    e = estimate(batch=16, **big)   # 32,768 KV tokens: the allocator peak fits 80 GB, vLLM's 0.9 pool does not
    assert not e.fits and "vllm's memory policy" in e.not_fit_reason and "32,768 tokens" in e.not_fit_reason
    assert "--quant fp8" not in e.not_fit_reason and "--kv-dtype fp8" in e.not_fit_reason   # flags not yet given
    assert estimate(batch=4, **big).fits
    assert estimate(batch=16, **{**big, "runtime": "eager"}).fits    # no engine pool: the allocator's peak only
    gen = dict(model="Llama-2-7b-hf", workload="generate", seq=128, gen=128, runtime="vllm", top_ops=None)
    assert any("at most 256 sequences per step" in a for a in estimate(device="a100", batch=384, **gen).assumptions)
    assert not any("sequences per step" in a for a in estimate(device="a100", batch=256, **gen).assumptions)


def test_new_user_findings_of_session_24_inputs(tmp_path):
    from typer.testing import CliRunner

    from aisim import estimate
    from aisim.cli import app
    from aisim.errors import AisimError

    base = json.loads((Path(__file__).resolve().parents[1] / "model_specs" / "Meta-Llama-3-8B.json").read_text())
    for change, said in (({"num_key_value_heads": 3}, "does not divide num_attention_heads"),
                         ({"hidden_size": 4097}, "not a multiple of num_attention_heads")):
        path = tmp_path / f"{next(iter(change))}.json"
        path.write_text(json.dumps({**base, **change}))
        with pytest.raises(AisimError, match=said):
            estimate(model=str(path), device="h100")
    runner = CliRunner()
    for args, said in ((["--dtype", "tf32"], "the dtypes a serving engine runs"),
                       (["--goodput", "ttft:300 ttft:10"], "gives ttft twice")):
        r = runner.invoke(app, ["serve", "-m", "opt-125m", "-d", "h100", "--num-requests", "10", *args])
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output
    ds = estimate(model="DeepSeek-V3", device="h200x8", workload="decode", batch=1, seq=256, runtime="vllm",
                  top_ops=None)
    assert any("sglang #2643" in a for a in ds.assumptions)
    lite = estimate(model="DeepSeek-V2-Lite", device="h100", workload="decode", seq=256, dtype="bf16", top_ops=None)
    assert not any("sglang #2643" in a for a in lite.assumptions)         # eager HF: not a serving engine
    lite = estimate(model="DeepSeek-V2-Lite", device="h100", workload="decode", seq=256, dtype="bf16", runtime="vllm",
                    top_ops=None)
    assert any("sglang #2643" in a and "fp8" not in a for a in lite.assumptions)   # bf16: nothing fp8
    capped = estimate(model="gpt2", device="h100", workload="decode", seq=256, power_limit_w=200, top_ops=None)
    assert any("optimistic in time and power" in a for a in capped.assumptions)


def test_new_user_findings_of_session_24_messages(tmp_path):
    from typer.testing import CliRunner

    from aisim import estimate
    from aisim.cli import app

    runner = CliRunner()
    shipped = Path(__file__).resolve().parents[1] / "hardware_specs" / "gpus" / "l4.yaml"
    cases = ((["estimate", "-m", "gpt2", "-d", "h100", "--dtype", "fp64"], "--dtype: give one of fp32, tf32, fp16, "
              "bf16, auto (got 'fp64')"),
             (["estimate", "-m", "gpt2", "-d", "h100", "--calibration", str(shipped)], "a GPU spec, not a calibration"),
             (["plan", "serve", "-m", "gpt2", "--devices", str(shipped), "--rate", "1"], "searches GPUs by name"),
             (["estimate", "-m", "gpt2", "-d", "h100", "--workload", "decode", "--static-cache-len", "10",
               "--runtime", "graphs"], "shorter than the longest context"))
    for args, said in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and said in r.output and r.output.count("\n") <= 2, (args, r.output)
    long = estimate(model="Meta-Llama-3-8B", device="h100x8", workload="train", batch=8, seq=16384, top_ops=None)
    assert any("beyond the model's 8,192 positions" in a for a in long.assumptions)
