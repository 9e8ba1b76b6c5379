"""Shared helpers of the harness scripts: model configs, JSONL output, time budget, timing, errors, tables.

Heavy modules (torch, transformers) are imported inside functions. Only ``aisim.validation.gpu`` is used from the
package (NVML readings, provenance header, NCCL-safe environment); it needs neither pydantic nor aisim.catalog.
GB = 1e9 bytes. Times in JSON are milliseconds (``*_ms``) or seconds (``*_s``).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from .. import gpu

HARNESS_DIR = Path(__file__).resolve().parent
CONFIG_DIR = HARNESS_DIR / "configs"
GB = 1e9
ERROR_CHARS = 600

# Tiny models for --smoke (2 layers, hidden 64): the same architectures as the real runs, seconds on a CPU.
TINY = {
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096,
                  tie_word_embeddings=True),
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096,
                  tie_word_embeddings=True, use_sliding_window=False),
    "olmoe": dict(model_type="olmoe", hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=512, num_experts=8,
                  num_experts_per_tok=2, max_position_embeddings=4096, pad_token_id=1, eos_token_id=2),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                      shared_expert_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=512, num_experts=6, num_experts_per_tok=2,
                      max_position_embeddings=4096, use_sliding_window=False),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      vocab_size=512, num_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
                      use_sliding_window=False),
}


def set_env() -> None:
    """NVLink multicast off (NCCL, symmetric memory, NVSHMEM) and no hub access (the GPU machines are offline)."""
    gpu.set_safe_env()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ----------------------------------------------------------------------------------------------- model configs


def config_path(name: str) -> Path:
    """A config.json for ``name``: a path, or NAME.json in harness/configs or in the shipped model_specs."""
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        return path
    candidates = [CONFIG_DIR / f"{name}.json"]
    try:
        import aisim.model_specs as specs

        candidates.append(Path(specs.__file__).resolve().parent / f"{name}.json")
    except ImportError:
        pass
    candidates.append(HARNESS_DIR.parent.parent / "model_specs" / f"{name}.json")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no config for model {name!r} (looked in {', '.join(str(c.parent) for c in candidates)})")


def config_dict(name: str) -> dict:
    """The config as a dict without the keys that start with '_' (``_source``, ``_name_or_path``)."""
    if name.startswith("tiny-"):
        return dict(TINY[name[len("tiny-"):]])
    data = json.loads(config_path(name).read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def hf_config(name: str, **overrides):
    """A transformers config built from the dict (AutoConfig.for_model: no hub, no remote code)."""
    from transformers import AutoConfig

    data = config_dict(name)
    data.update(overrides)
    model_type = data.pop("model_type")
    return AutoConfig.for_model(model_type, **data)


def build_causal_lm(config, dtype, device, attn_implementation: str | None = None, seed: int = 0):
    """``AutoModelForCausalLM.from_config`` built directly on ``device`` (random weights, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    kwargs = {"dtype": dtype, "trust_remote_code": False}  # never code from a config
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    return model.eval()


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------------ output


class JsonlOut:
    """Append-only JSONL: one compact line per record, flushed at once (a killed run keeps its finished lines)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":"), default=_json_default)
        if self.path is None:
            return
        with open(self.path, "a") as handle:
            handle.write(line + "\n")
            handle.flush()


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def header(script: str, args, **extra) -> dict:
    """The provenance line (gpu.environment_header: GPU name, driver, CUDA, torch, transformers, date, power
    limit, ...) plus the script name and its arguments."""
    import torch

    record = gpu.environment_header()
    record.update({"script": script, "argv": sys.argv[1:], "args": vars(args) if args is not None else None,
                   "cuda_available": torch.cuda.is_available(), "cpu_threads": torch.get_num_threads()})
    record.update(extra)
    return record


def host_record(when: str) -> dict:
    """This machine's eager CPU costs (validation/host.py, about 10-20 s on CUDA device 0) as a ``type: host`` line,
    so that a report can estimate the run with the host it ran on; a failure is recorded, never raised."""
    t0 = time.perf_counter()
    try:
        from aisim.validation.host import measure_host
        record = measure_host()
    except Exception as exc:  # noqa: BLE001 - the cases matter more than the host line
        record = {"type": "host", "status": classify_error(exc)[0], "error": classify_error(exc)[1]}
    record.update(when=when, host_s=round(time.perf_counter() - t0, 2))
    return record


def start_run(script: str, args, device, **header_extra) -> tuple["JsonlOut", "Budget", bool]:
    """(the JSONL output with its header written, the --max-minutes budget, whether host lines are written): on a
    CUDA device without --no-host, the ``start`` host line is written too (the caller writes ``end``)."""
    out = JsonlOut(args.out)
    out.write({**header(script, args), **header_extra})
    measure_host = device.type == "cuda" and not getattr(args, "no_host", False)
    if measure_host:
        out.write(host_record("start"))
    return out, Budget(args.max_minutes), measure_host


def open_run(script: str, args):
    """The common prologue of a harness script after its arguments: environment, device (CPU threads capped under
    --smoke) and ``start_run``. Returns (device, out, budget, measure_host)."""
    set_env()
    device = pick_device()
    if args.smoke:
        smoke_threads(device)
    return (device, *start_run(script, args, device))


def close_run(out: "JsonlOut", measure_host: bool) -> int:
    """The common epilogue: the ``end`` host line where the run wrote a ``start`` one; exit status 0."""
    if measure_host:
        out.write(host_record("end"))
    return 0


def rounded(values, digits: int = 3) -> list:
    return [None if v is None else round(float(v), digits) for v in values]


# ------------------------------------------------------------------------------------------------------ budget


class Budget:
    """A wall-clock budget: ``left()`` seconds remain; ``allows(s)`` if a step of ~s seconds still fits."""

    def __init__(self, max_minutes: float | None):
        self.start = time.time()
        self.deadline = None if max_minutes is None else self.start + 60.0 * max_minutes

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.time()

    def expired(self) -> bool:
        return self.left() <= 0

    def allows(self, seconds: float = 0.0) -> bool:
        return self.left() > seconds


# ------------------------------------------------------------------------------------------------------ errors


def classify_error(exc: BaseException) -> tuple[str, str]:
    """('oom' | 'error', 'Type: message') for an exception of a case."""
    text = f"{type(exc).__name__}: {exc}"
    oom_types = ()
    try:
        import torch

        oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                      getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    except ImportError:
        pass
    lowered = str(exc).lower()
    is_oom = (oom_types and isinstance(exc, oom_types)) or "out of memory" in lowered or isinstance(exc, MemoryError)
    return ("oom" if is_oom else "error"), text[:ERROR_CHARS]


def is_fatal_device_error(exc: BaseException) -> bool:
    """A CUDA error that poisons the process's context (illegal address, device-side assert)."""
    text = str(exc)
    return type(exc).__name__ == "AcceleratorError" or "device-side assert" in text or "illegal memory" in text


def free_memory(collect: bool = True) -> None:
    """Return cached blocks to the driver; ``collect`` runs the garbage collector first (0.1-0.3 s with
    transformers imported: needed after an exception, whose traceback keeps the case's tensors in a cycle)."""
    import gc

    import torch

    if collect:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------------ device


def smoke_threads(device) -> None:
    """--smoke on a CPU: one intra-op thread. Tiny ops gain nothing from more, and on a shared host OpenMP threads
    that wait for busy cores made single small ops (index_add_) 100x slower."""
    import torch

    if device.type == "cpu":
        torch.set_num_threads(1)


def pick_device(index: int = 0):
    import torch

    return torch.device("cuda", index) if torch.cuda.is_available() else torch.device("cpu")


def sync(device) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def memory(device) -> dict:
    """Peak allocated / reserved (torch caching allocator) since the last reset, and now; None on the CPU."""
    import torch

    if device.type != "cuda":
        return {"peak_allocated_gb": None, "peak_reserved_gb": None, "allocated_gb": None}
    return {"peak_allocated_gb": round(torch.cuda.max_memory_allocated(device) / GB, 4),
            "peak_reserved_gb": round(torch.cuda.max_memory_reserved(device) / GB, 4),
            "allocated_gb": round(torch.cuda.memory_allocated(device) / GB, 4)}


class EnergyWindow:
    """NVML total-energy counter (nvmlDeviceGetTotalEnergyConsumption) read on a counter step at both ends."""

    def __init__(self, device):
        self.handle = gpu.nvml_handle(device.index or 0) if device.type == "cuda" else None
        self.tick0 = None

    def start(self) -> None:
        self.tick0 = gpu.wait_energy_tick(self.handle)

    def stop(self) -> dict:
        tick1 = gpu.wait_energy_tick(self.handle)
        if self.tick0 is None or tick1 is None:
            return {"energy_j": None, "energy_window_s": None, "avg_power_w": None}
        joules = (tick1[1] - self.tick0[1]) / gpu.MJ_PER_J
        window = tick1[0] - self.tick0[0]
        return {"energy_j": round(joules, 3), "energy_window_s": round(window, 4),
                "avg_power_w": round(joules / window, 2) if window > 0 else None}


# ------------------------------------------------------------------------------------------------------ timing


def time_steps(step, device, *, warmup: int = 2, min_trials: int = 5, max_trials: int = 50,
               min_time_s: float = 0.3, after=None) -> list[float]:
    """Milliseconds of ``step()`` per trial: CUDA events on the current stream (perf_counter on the CPU), after
    ``warmup`` untimed steps; n trials with min_trials <= n <= max_trials lasting >= min_time_s. ``after()`` runs
    untimed after every step (e.g. cropping a KV cache back)."""
    import torch

    after = after or (lambda: None)
    cuda = device.type == "cuda"
    one = 1e-3
    for i in range(max(1, warmup)):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        one = time.perf_counter() - t0
        after()
    n = int(min(max_trials, max(min_trials, math.ceil(min_time_s / max(one, 1e-6)))))
    times = []
    for _ in range(n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        after()
    return times


def summary(times_ms: list[float]) -> dict:
    if not times_ms:
        return {"median_ms": None, "mean_ms": None, "min_ms": None, "max_ms": None, "trials": 0}
    return {"median_ms": round(statistics.median(times_ms), 4), "mean_ms": round(statistics.fmean(times_ms), 4),
            "min_ms": round(min(times_ms), 4), "max_ms": round(max(times_ms), 4), "trials": len(times_ms)}


# ------------------------------------------------------------------------------------------------------ tables


def print_table(rows: list[dict], columns: list[str], title: str | None = None) -> None:
    """A plain fixed-width table of ``columns`` (missing -> '-'); floats with 4 significant digits."""
    def fmt(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    if title:
        print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    sys.stdout.flush()


def parse_ints(text: str) -> list[int]:
    return _parse_list(text, int)


def parse_floats(text: str) -> list[float]:
    return _parse_list(text, float)


def _parse_list(text: str, kind) -> list:
    """A comma-separated option value; a bad one stops the script with one line (exit 1), as argparse would."""
    try:
        return [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: {text!r} is not a comma-separated list of {kind.__name__} values") from None


def time_calls(calls, device, window_ms: float, windows: int, warm: int = 2, max_reps: int = 5000
               ) -> tuple[list[float], list[float]]:
    """Per-call milliseconds, device and host: ``windows`` event-timed windows of repeated calls (cycling through
    ``calls``); host = CPU time of the loop before the end event is waited for. Where host >= device the loop was
    host-bound and the device figure is the dispatch rate, not the kernel time."""
    import torch

    cuda = device.type == "cuda"
    for fn in calls[:warm]:
        fn()
    sync(device)
    t0 = time.perf_counter()
    for fn in calls:
        fn()
    sync(device)
    per_call_s = max((time.perf_counter() - t0) / len(calls), 1e-7)
    reps = min(max(len(calls), int(math.ceil(window_ms / 1e3 / per_call_s))), max_reps)
    device_ms, host_ms = [], []
    for _ in range(windows):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t = time.perf_counter()
            for i in range(reps):
                calls[i % len(calls)]()
            host_ms.append((time.perf_counter() - t) * 1e3 / reps)
            end.record()
            end.synchronize()
            device_ms.append(start.elapsed_time(end) / reps)
        else:
            t = time.perf_counter()
            for i in range(reps):
                calls[i % len(calls)]()
            host_ms.append((time.perf_counter() - t) * 1e3 / reps)
            device_ms.append(host_ms[-1])
    return device_ms, host_ms


def device_events(prof):
    """(name, microseconds) of every device-side event (CUDA kernels, memcpys, syncs) of a torch.profiler session."""
    for event in prof.events():
        if not str(getattr(event, "device_type", "")).endswith(("CUDA", "PrivateUse1")):
            continue
        try:
            duration = event.time_range.elapsed_us()
        except Exception:  # noqa: BLE001
            duration = getattr(event, "device_time", 0.0) or getattr(event, "cuda_time", 0.0) or 0.0
        yield event.name, float(duration)


def harness_parser(doc: str, smoke_help: str):
    """The arguments every harness script takes (README.md): ``--out`` (JSONL, appended), ``--max-minutes`` (soft
    budget, checked between cases) and ``--smoke`` (``smoke_help``: what the script's CPU smoke run does)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="JSONL output (appended)")
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--smoke", action="store_true", help=smoke_help)
    return parser
