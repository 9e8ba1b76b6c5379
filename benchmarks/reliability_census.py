"""Reliability census: try a few hundred inputs as a careful (and a careless) user would, and count the outcomes.

``python benchmarks/reliability_census.py [--timeout 60] [--only TEXT] [--show CLASS]``

Each input runs in a forked child (the CLI through typer's CliRunner, the Python API, or spec/config files in a
temporary user directory) with a time limit, and is classified:

- ok: exit 0 with a finite, positive answer, and the input was one to answer;
- clean error: exit 2 (or an AisimError from the API) with a one-line message;
- traceback: any other exception or exit code;
- silent wrong: exit 0 with NaN, infinity or a nonpositive runtime in the output, or an input that must be refused
  answered anyway;
- hang: the child ran past the time limit;
- code execution: a sentinel file that only the input's payload would create exists afterwards.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEV = "a100-sxm4-80gb"
CLASSES = ("ok", "clean error", "traceback", "silent wrong", "hang", "code execution")
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "tie_word_embeddings": False}


# ------------------------------------------------------------------ the inputs

def cli_cases() -> list[tuple[str, list[str], str]]:
    """(name, CLI args, expected: ok | error | any)."""
    base = ["estimate", "-m", "opt-125m", "-d", DEV, "--seq", "64", "--json"]
    bad = {
        "--batch": ["0", "-1", "-3", str(10**12), "1.5", "abc", ""],
        "--seq": ["0", "-5", str(10**13), "x"],
        "--pp": ["0", "-1", "3", "1e3"], "--dp": ["0", "-2", "3"], "--tp": ["0", "-1", "5", "7"],
        "--gen": ["0", "-1", str(10**9)],
        "--gpu-clock": ["0.001", "1e-300", "5e-324", "0", "-100", "nan", "inf", "-inf", "1e9", "2000"],
        "--power-limit": ["0", "-1", "nan", "inf", "1e12", "20"],
        "--power-mode": ["turbo", ""], "--dtype": ["fp12", "", "FP16x"], "--quant": ["int3", ""],
        "--tp-scope": ["some", ""], "--workload": ["sing", ""], "--runtime": ["vllm9", "", "../eager"],
        "--calibration": ["/nonexistent.yaml", "", "/tmp", "h100"], "--model": ["", " ", "opt-6.8b", "missing.json",
                                                                             "/", "../../etc/passwd", "x" * 5000],
        "--device": ["", "h10", "h100x0", "h100x-1", "h100x10000000000", "missing.yaml", "/tmp", "a6000x8x",
                     "xx8", "h100 x 2 x 2"],
        "--audio-s": ["60"], "--windows": ["3"], "--tokens": ["10"], "--step-tokens": ["0", "-1", "65"],
        "--beam": ["0"],
    }
    good = {"--batch": ["1", "2", "8"], "--seq": ["1", "16", "128"], "--gpu-clock": ["1410", "141", "700"],
            "--power-limit": ["300", "400"], "--dtype": ["fp32", "bf16", "tf32"],
            "--quant": ["int8", "fp8", "int4", "bitsandbytes-int8"], "--runtime": ["graphs", "kernel-sum"],
            "--calibration": ["none", "auto"], "--workload": ["prefill", "forward-backward", "train"],
            "--model": ["gpt2", "opt-350m", "facebook/opt-125m"], "--device": ["l4", "h100-pcie", "rtx-4090",
                                                                              "a100-sxm4-80gbx2", "rtx-a6000x4"],
            "--with-loss": [None]}
    out = []
    for flag, values in bad.items():
        for v in values:
            out.append((f"estimate {flag} {v[:20]!r}", base + [flag, v], "error"))
    for flag, values in good.items():
        for v in values:
            out.append((f"estimate {flag} {v}", base + ([flag] if v is None else [flag, v]), "ok"))
    dec = base[:5] + ["--workload", "decode", "--json"]
    out += [("decode --seq 1", dec + ["--seq", "1"], "error"), ("decode --seq 2", dec + ["--seq", "2"], "ok"),
            ("generate --gen 4", base + ["--workload", "generate", "--gen", "4"], "ok"),
            ("generate --gen 1", base + ["--workload", "generate", "--gen", "1"], "ok"),
            *((f"generate --gen {v}", base + ["--workload", "generate", "--gen", v], "error")
              for v in ("0", "-1", str(10**9))),
            ("tp-scope full x2", base[:4] + [f"{DEV}x2", "--seq", "64", "--tp-scope", "full", "--json"], "ok"),
            ("opt-1.3b full tp2", ["estimate", "-m", "opt-1.3b", "-d", f"{DEV}x2", "--seq", "64", "--tp-scope",
                                   "full", "--json"], "ok"),
            ("gpt2 int8", ["estimate", "-m", "gpt2", "-d", DEV, "--seq", "64", "--quant", "int8", "--json"], "ok"),
            ("pp 2 on x2", base[:4] + [f"{DEV}x2", "--seq", "64", "--pp", "2", "--json"], "ok"),
            ("dp 2 batch 2 on x2", base[:4] + [f"{DEV}x2", "--seq", "64", "--dp", "2", "--batch", "2", "--json"],
             "ok"),
            ("dp 2 batch 1 on x2", base[:4] + [f"{DEV}x2", "--seq", "64", "--dp", "2", "--json"], "error"),
            ("h100x100000", base[:4] + ["h100x100000", "--seq", "16", "--json"], "any"),
            ("huge batch OOM", base + ["--batch", "100000"], "ok")]
    tr = ["estimate", "-m", "whisper-tiny", "-d", DEV, "--workload", "transcribe", "--json"]
    out += [(f"transcribe {' '.join(x)}", tr + x, e) for x, e in [
        (["--audio-s", "60"], "ok"), (["--audio-s", "1"], "ok"), (["--audio-s", "31622400"], "ok"),
        (["--audio-s", "1e12"], "error"), (["--audio-s", "0"], "error"), (["--audio-s", "-5"], "error"),
        (["--audio-s", "nan"], "error"), (["--audio-s", "inf"], "error"), ([], "error"),
        (["--audio-s", "60", "--windows", "1000000000"], "error"), (["--audio-s", "60", "--windows", "0"], "error"),
        (["--audio-s", "600", "--windows", "2"], "error"), (["--audio-s", "60", "--tokens", "100000"], "error"),
        (["--audio-s", "60", "--tokens", "0"], "error"), (["--audio-s", "60", "--beam", "0"], "error"),
        (["--audio-s", "60", "--beam", "1000"], "error"), (["--audio-s", "60", "--beam", "1"], "ok"),
        (["--audio-s", "60", "--runtime", "ggml-vulkan"], "ok"), (["--audio-s", "60", "--runtime", "eager"], "ok"),
        (["--audio-s", "60", "-d", "mi300x"], "error"), (["--audio-s", "60", "-d", "a100-sxm4-80gbx2"], "error"),
        (["--audio-s", "60", "-d", "gtx-1650-mobile", "--power-mode", "power-saver"], "ok"),
        (["--audio-s", "60", "--windows", "1000000"], "ok")]]
    out += [("transcribe opt-125m", base + ["--workload", "transcribe", "--audio-s", "60"], "error"),
            ("list models", ["list", "models"], "ok"), ("list devices", ["list", "devices"], "ok"),
            ("list runtimes", ["list", "runtimes"], "ok"), ("list gpus", ["list", "gpus"], "error"),
            ("trace opt-125m", ["trace", "-m", "opt-125m", "--seq", "64", "--device", DEV, "--json"], "ok"),
            ("trace bad seq", ["trace", "-m", "opt-125m", "--seq", "0"], "error"),
            ("serve-bench ok", ["serve-bench", "-m", "opt-125m", "-d", DEV, "--shards", "1", "--batch", "1,2",
                                "--seq", "64", "--json"], "ok"),
            ("serve-bench shards 0", ["serve-bench", "-m", "opt-125m", "-d", DEV, "--shards", "0"], "error"),
            ("serve-bench batch a", ["serve-bench", "-m", "opt-125m", "-d", DEV, "--batch", "a,b"], "error"),
            ("serve-bench shards 3", ["serve-bench", "-m", "opt-125m", "-d", DEV, "--shards", "5"], "any"),
            ("serve-bench decode 0", ["serve-bench", "-m", "opt-125m", "-d", DEV, "--decode-len", "0"], "error")]
    return out


CONFIGS = {
    "list": [1, 2], "string": "llama", "number": 3, "null": None, "empty object": {},
    "no model_type": {"hidden_size": 64}, "unknown model_type": {**TINY, "model_type": "nonesuch"},
    "negative layers": {**TINY, "num_hidden_layers": -2}, "zero layers": {**TINY, "num_hidden_layers": 0},
    "zero hidden": {**TINY, "hidden_size": 0}, "string layers": {**TINY, "num_hidden_layers": "4"},
    "float heads": {**TINY, "num_attention_heads": 4.0}, "bool layers": {**TINY, "num_hidden_layers": True},
    "huge vocab": {**TINY, "vocab_size": 10**30}, "heads do not divide": {**TINY, "num_attention_heads": 5},
    "kv heads do not divide": {**TINY, "num_key_value_heads": 3}, "nan dim": {**TINY, "hidden_size": float("nan")},
    "list layers": {**TINY, "num_hidden_layers": [2]}, "name int": {**TINY, "_name_or_path": 5},
    "no architectures": {k: v for k, v in TINY.items() if k != "architectures"},
    "unknown architecture": {**TINY, "architectures": ["Nope"]}, "architectures int": {**TINY, "architectures": 3},
    "auto_map int": {**TINY, "auto_map": 1}, "model_type int": {**TINY, "model_type": 7},
    "rope_scaling junk": {**TINY, "rope_scaling": "x"}, "tiny ok": TINY, "bert (not causal)": {
        "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100},
    "max positions 1": {**TINY, "max_position_embeddings": 1},
}
RAW_CONFIGS = {"binary": b"\x80\x81\xfe\xff" * 10, "deep nesting": b"[" * 100_000 + b"]" * 100_000,
               "torn": b'{"a": ', "empty file": b"", "utf-16": json.dumps(TINY).encode("utf-16"),
               "huge": b'{"model_type": "llama", "x": "' + b"a" * (5 * 2**20) + b'"}'}


def gpu_spec() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "hardware_specs" / "gpus" / "l4.yaml").read_text())


SPEC_FIELDS = {"memory_bw_bytes_per_s": [-1.0, 0.0, float("nan"), float("inf"), "fast", None],
               "memory_bytes": [0, -5, 1e300], "board_power_w": [-300, 0, 1], "idle_power_w": [0, 100],
               "boost_clock_mhz": [0, float("nan")], "sm_count": [0, 2.5, -1], "l2_bytes": [0],
               "peak_flops_per_s": [{"fp32": -1, "fp16": 1e12}, None, [1], {"fp32": 1e12}],
               "pcie_gen": [0, 99], "vendor": [None, 5], "power_modes": [{"x": {"power_limit_w": -1}}, 3]}
SPEC_FILES = [("gpus", "- a list\n"), ("gpus", "\x00\x01 garbage: [\n"), ("gpus", ""),
              ("systems", "name: s\ngpu: l4\ngpu_count: 0\n"), ("systems", "name: s\ngpu: nonesuch\ngpu_count: 2\n"),
              ("runtimes", "name: r\nper_step_overhead_s: -1\n"), ("runtimes", "name: r\ncompute_efficiency_scale: 50\n"),
              ("calibration", "device: l4\nlaunch_overhead_s: nan\n"), ("gpus", None)]


# ------------------------------------------------------------------ running one case in a child

def _child(kind: str, payload, env: dict, conn) -> None:
    os.environ.update(env)
    import warnings

    warnings.simplefilter("ignore")
    from aisim import specs

    specs.clear_caches()
    try:
        if kind == "cli":
            from typer.testing import CliRunner

            from aisim.cli import app

            r = CliRunner().invoke(app, payload, env={"COLUMNS": "200"})
            exc = r.exception if r.exception is not None and not isinstance(r.exception, SystemExit) else None
            conn.send(("cli", r.exit_code, repr(exc) if exc else None, r.stdout[-200_000:], r.output[-400:]))
        else:
            import aisim
            from aisim.errors import AisimError

            try:
                result = aisim.estimate(**payload)
                conn.send(("api", 0, None, result.model_dump_json(), ""))
            except AisimError as exc:
                conn.send(("api", 2, None, "", str(exc)))
            except TypeError as exc:   # Python's own refusal of an unknown keyword: one line, at the call
                if "unexpected keyword argument" not in str(exc):
                    raise
                conn.send(("api", 2, None, "", str(exc)))
    except BaseException as exc:  # noqa: BLE001 - classified as a traceback
        conn.send(("cli", 1, repr(exc), "", ""))


def _non_finite_or_nonpositive(text: str) -> str | None:
    if not text.lstrip().startswith("{"):
        return None
    if "Infinity" in text or "NaN" in text:
        return "Infinity/NaN in the output"
    data = json.loads(text)
    if data.get("fits") and "runtime_ms" in data and not (data["runtime_ms"] or 0) > 0:
        return f"runtime_ms {data['runtime_ms']}"
    if "memory_gb" in data and not data["memory_gb"] > 0:
        return f"memory_gb {data['memory_gb']}"
    for v in _numbers(data):
        if not math.isfinite(v):
            return "non-finite number"
    return None


def _numbers(data):
    if isinstance(data, float):
        yield data
    elif isinstance(data, dict):
        for v in data.values():
            yield from _numbers(v)
    elif isinstance(data, list):
        for v in data:
            yield from _numbers(v)


def classify(kind: str, payload, expected: str, env: dict, timeout: float, sentinel: Path | None):
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(kind, payload, env, child))
    start = time.perf_counter()
    proc.start()
    got = parent.recv() if parent.poll(timeout) else None
    proc.join(1 if got else 0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    seconds = time.perf_counter() - start
    if sentinel is not None and sentinel.exists():
        return "code execution", "sentinel created", seconds
    if got is None:
        return "hang", f"no answer in {timeout:g} s", seconds
    _, code, exc, stdout, tail = got
    if exc or code not in (0, 2):
        return "traceback", (exc or tail)[-200:], seconds
    if code == 2:
        return "clean error", tail.strip().splitlines()[-1][:160] if tail.strip() else "", seconds
    wrong = _non_finite_or_nonpositive(stdout)
    if wrong:
        return "silent wrong", wrong, seconds
    if expected == "error":
        return "silent wrong", "answered an input that must be refused", seconds
    return "ok", "", seconds


# ------------------------------------------------------------------ the census

def build_cases(tmp: Path) -> list[tuple]:
    """(name, kind, payload, expected, env, sentinel)."""
    import yaml

    env = {"AISIM_CACHE_DIR": str(tmp / "cache"), "AISIM_SPECS_DIR": str(tmp / "nospecs")}
    cases = [(n, "cli", a, e, env, None) for n, a, e in cli_cases()]
    for name, content in CONFIGS.items():
        path = tmp / "configs" / name.replace(" ", "_") / "config.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(content))
        expected = "ok" if name in ("tiny ok", "no architectures", "unknown architecture") else "any"
        if name in ("list", "string", "number", "null", "empty object", "no model_type", "negative layers",
                    "zero layers", "zero hidden", "string layers", "bool layers", "huge vocab", "auto_map int",
                    "model_type int", "unknown model_type", "list layers", "nan dim"):
            expected = "error"
        cases.append((f"config {name}", "cli", ["estimate", "-m", str(path), "-d", DEV, "--seq", "16", "--json"],
                      expected, env, None))
    for name, raw in RAW_CONFIGS.items():
        path = tmp / "configs" / name.replace(" ", "_") / "config.json"
        path.parent.mkdir(parents=True)
        path.write_bytes(raw)
        cases.append((f"config {name}", "cli", ["estimate", "-m", str(path), "-d", DEV, "--json"], "error", env,
                      None))
    good = gpu_spec()
    for field, values in SPEC_FIELDS.items():
        for i, value in enumerate(values):
            path = tmp / "gpuspecs" / f"{field}-{i}.yaml"
            path.parent.mkdir(exist_ok=True)
            path.write_text(yaml.safe_dump({**good, "name": "broken", field: value}))
            expected = "ok" if (field, value) == ("memory_bytes", 1e300) else "error"
            cases.append((f"gpu spec {field}={value!r}", "cli", ["estimate", "-m", "opt-125m", "-d", str(path),
                                                               "--seq", "16", "--json"], expected, env, None))
    for i, (sub, content) in enumerate(SPEC_FILES):
        folder = tmp / f"userspecs{i}"
        for s in ("gpus", "systems", "runtimes", "calibration"):
            (folder / s).mkdir(parents=True)
        if content is None:   # a second file claiming a shipped alias
            content = yaml.safe_dump({**good, "name": "l4-copy", "aliases": ["h100"]})
        (folder / sub / ("l4.yaml" if sub == "calibration" else "bad.yaml")).write_text(content)
        user = {**env, "AISIM_SPECS_DIR": str(folder)}
        for what in ("models", "devices", "runtimes"):
            cases.append((f"user {sub} file {i}: list {what}", "cli", ["list", what], "ok", user, None))
        cases.append((f"user {sub} file {i}: estimate h100-pcie", "cli", ["estimate", "-m", "opt-125m", "-d",
                                                                          "h100-pcie", "--seq", "16", "--json"],
                      "ok", user, None))
        cases.append((f"user {sub} file {i}: estimate h100", "cli", ["estimate", "-m", "opt-125m", "-d", "h100",
                                                                     "--seq", "16", "--json"], "any", user, None))
    cases += api_cases(tmp, env)
    cases += code_cases(tmp, env)
    cases += validate_cases(tmp, env)
    return cases


def api_cases(tmp: Path, env: dict) -> list[tuple]:
    tiny = tmp / "configs" / "tiny_ok" / "config.json"
    base = {"model": tiny, "device": DEV, "seq": 16}
    bad = [{"model": None}, {"model": 5}, {"device": None}, {"device": 3}, {"dp": None, "tp": "2"},
           {"power_limit_w": "300"}, {"batch": 1.5}, {"batch": "2"}, {"seq": True}, {"top_ops": -1},
           {"gpu_clock_mhz": float("nan")}, {"gpu_clock_mhz": 1e-300}, {"audio_s": float("inf"),
                                                                        "workload": "transcribe"},
           {"tp": 0}, {"pp": -1}, {"dp": 0}, {"workload": "nope"}, {"dtype": "fp64"}, {"runtime": 3},
           {"calibration": 3}, {"optimizer": "lion"}, {"with_loss": "yes"}, {"quant": None}, {"nonsense": 1},
           {"windows": 10**12, "workload": "transcribe", "audio_s": 60}, {"step_tokens": 0}, {"beam": 10**9}]
    good = [{}, {"model": str(tiny)}, {"top_ops": 0}, {"top_ops": None}, {"power_limit_w": 300.0},
            {"workload": "decode"}, {"workload": "generate", "gen": 3}, {"batch": 4}]
    return ([(f"api {b}", "api", {**base, **b}, "error", env, None) for b in bad] +
            [(f"api {g}", "api", {**base, **g}, "ok", env, None) for g in good])


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def code_cases(tmp: Path, env: dict) -> list[tuple]:
    """The two code-execution routes: a config's auto_map, and a pickle in the graph cache."""
    out = []
    for i, auto_map in enumerate([{"AutoConfig": "modeling_evil.EvilConfig"},
                                  {"AutoModelForCausalLM": "modeling_evil.Evil"}, ["modeling_evil.Evil"]]):
        folder = tmp / f"evil{i}"
        folder.mkdir()
        sentinel = folder / "ran"
        (folder / "modeling_evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('x')\n")
        (folder / "config.json").write_text(json.dumps({**TINY, "model_type": "evil" if i else "llama",
                                                        "auto_map": auto_map}))
        out.append((f"auto_map config {i}", "cli", ["estimate", "-m", str(folder), "-d", DEV, "--seq", "16"],
                    "error", env, sentinel))
    cache = tmp / "pickled-cache"
    graphs = cache / "graphs"
    graphs.mkdir(parents=True)
    sentinel = tmp / "pickle-ran"
    payload = pickle.dumps(_Payload(str(sentinel)))
    sys.path.insert(0, str(ROOT))
    from aisim.graph import cache as graph_cache

    for seq in ("16", "32"):   # a pickle under every plausible entry name, then an estimate that reads the cache
        for n in range(20):
            (graphs / f"{n:032x}{graph_cache.SUFFIX}").write_bytes(payload)
            (graphs / f"{n:032x}.pkl").write_bytes(payload)
        out.append((f"pickled graph cache seq {seq}", "cli", ["estimate", "-m", "gpt2", "-d", DEV, "--seq", seq,
                                                              "--json"], "ok", {**env, "AISIM_CACHE_DIR": str(cache)},
                    sentinel))
    return out


def validate_cases(tmp: Path, env: dict) -> list[tuple]:
    suite = tmp / "suite.yaml"
    suite.write_text("name: s\ncases:\n  - {model: opt-125m, batch: 1, seq: 16}\n")
    out_file = tmp / "o.jsonl"
    bad_suites = {"flow": "name: x\ncases: [1, 2\n", "cases int": "cases: 5\n", "list": "- 1\n- 2\n",
                  "batch str": "cases:\n  - {model: opt-125m, batch: a}\n", "case list": "cases:\n  - [1, 2]\n",
                  "shapes int": "cases:\n  - {model: opt-125m, shapes: 3}\n", "binary": "\x00\x01",
                  "empty": "", "no cases": "name: x\n"}
    cases = []
    for name, text in bad_suites.items():
        path = tmp / f"suite-{name.replace(' ', '_')}.yaml"
        path.write_text(text)
        cases.append((f"validate suite {name}", "cli", ["validate", str(path), "--out", str(out_file)], "error",
                      env, None))
    data = tmp / "d.jsonl"
    case = {"type": "case", "key": "k", "model": "opt-125m", "workload": "forward", "batch": 1, "seq": 16,
            "dtype": "fp16", "tp": 1, "status": "ok", "runtime_ms_median": -3.0}
    lines = [{"type": "header", "gpu_name": "NVIDIA A100-SXM4-80GB"}, case, [1, 2], "text", None, 5,
             {**case, "key": "k2", "runtime_ms_median": float("inf")}, {"type": "case"}]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n{torn")
    good = tmp / "good.jsonl"
    good.write_text(json.dumps(lines[0]) + "\n" + json.dumps({**case, "runtime_ms_median": 1.0}) + "\n")
    cases += [
        ("validate suite without CUDA", "cli", ["validate", str(suite), "--out", str(out_file)], "error", env, None),
        ("validate --out dir", "cli", ["validate", str(suite), "--out", str(tmp)], "error", env, None),
        ("validate suite dir", "cli", ["validate", str(tmp), "--out", str(out_file)], "error", env, None),
        ("validate missing suite", "cli", ["validate", str(tmp / "nope.yaml"), "--out", str(out_file)], "error",
         env, None),
        ("validate --max-minutes -1", "cli", ["validate", str(suite), "--out", str(out_file), "--max-minutes", "-1"],
         "error", env, None),
        ("validate --max-minutes nan", "cli", ["validate", str(suite), "--out", str(out_file), "--max-minutes",
                                               "nan"], "error", env, None),
        ("validate no --out", "cli", ["validate", str(suite)], "error", env, None),
        ("validate nothing", "cli", ["validate"], "error", env, None),
        ("report missing", "cli", ["validate", "--report", str(tmp / "missing.jsonl")], "error", env, None),
        ("report dir", "cli", ["validate", "--report", str(tmp)], "error", env, None),
        ("report broken rows json", "cli", ["validate", "--report", str(data), "--format", "json"], "ok", env,
         None),
        ("report good json", "cli", ["validate", "--report", str(good), "--format", "json"], "ok", env, None),
        ("report good rst", "cli", ["validate", "--report", str(good)], "ok", env, None),
        ("report bad format", "cli", ["validate", "--report", str(good), "--format", "xml"], "error", env, None),
        ("reference unknown", "cli", ["validate", "--reference", "nope"], "error", env, None),
    ]
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--only", default=None, help="run only cases whose name contains this text")
    parser.add_argument("--show", default="traceback,silent wrong,hang,code execution",
                        help="classes whose cases are listed")
    args = parser.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore")
    import torch  # noqa: F401 - imported once here, so each forked child starts warm
    import transformers  # noqa: F401
    from typer.testing import CliRunner  # noqa: F401

    import aisim.api  # noqa: F401
    import aisim.cli  # noqa: F401
    import aisim.graph.extract  # noqa: F401
    with tempfile.TemporaryDirectory(prefix="aisim-census-") as tmp:
        cases = [c for c in build_cases(Path(tmp)) if args.only is None or args.only in c[0]]
        counts = {c: 0 for c in CLASSES}
        refused_valid, shown = [], []
        start = time.perf_counter()
        for name, kind, payload, expected, env, sentinel in cases:
            outcome, detail, seconds = classify(kind, payload, expected, env, args.timeout, sentinel)
            counts[outcome] += 1
            print(f"{outcome:15s} {seconds:5.1f}s {name[:70]}", file=sys.stderr, flush=True)
            if outcome == "clean error" and expected == "ok":
                refused_valid.append((name, detail))
            if outcome in args.show.split(","):
                shown.append((outcome, name, detail, seconds))
        total = time.perf_counter() - start
    for outcome, name, detail, seconds in shown:
        print(f"{outcome:15s} {name[:60]:60s} {seconds:6.1f}s {detail}")
    for name, detail in refused_valid:
        print(f"{'refused (valid)':15s} {name[:60]:60s} {detail}")
    print(f"\n| inputs tried | {' | '.join(CLASSES)} |\n|---|{'---|' * len(CLASSES)}")
    print(f"| {len(cases)} | {' | '.join(str(counts[c]) for c in CLASSES)} |")
    print(f"\n{total:.0f} s; a clean error counts an input refused with a one-line message (exit 2)")
    return 0 if all(counts[c] == 0 for c in CLASSES[2:]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
