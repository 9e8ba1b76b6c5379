"""Run a measurement suite into a JSONL dataset: ``python -m aisim.validation.runner SUITE --out FILE``.

The file is a sequence of sections: a provenance header line (``type: header``: GPU, driver, CUDA, torch,
transformers, power limit, date, host, aisim version) followed by one ``type: case`` line per finished case,
appended and flushed as soon as the case ends. A rerun with the same file skips cases already finished
(status ok or oom) under a header of the same GPU name, and writes a new header for the lines it adds.
Cases that share a model, dtype and TP plan run together on one built model; a case that fails (oom, error) is
recorded and the run goes on; ``max_minutes`` stops cleanly between cases.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from .cli import new_app, run

from ..errors import AisimError
from .suite import Case, MeasureSettings, Suite, group_cases, load_suite

FINISHED = ("ok", "oom")
STATUSES = ("ok", "oom", "error", "skipped")
METRIC_FIELDS = ("runtime_ms_median", "runtime_ms_mean", "runtime_ms_std", "runtime_ms_min", "trials",
                 "peak_memory_gb", "nvml_memory_gb", "energy_j_per_step", "energy_j_per_token", "avg_power_w",
                 "throughput_tokens_per_s", "tp_impl")


class RunError(AisimError):
    """The run cannot start (e.g. the output file holds measurements of another GPU); the message says why."""


class DeviceLost(Exception):
    """A CUDA error left this process's context unusable; the finished cases are kept, a rerun continues."""


def read_jsonl(path: str | Path) -> list[dict]:
    """The lines of a dataset; a torn last line (a run killed mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    lines = []
    with open(path) as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except (json.JSONDecodeError, RecursionError):
                line = None
            if isinstance(line, dict):
                lines.append(line)
            else:
                print(f"warning: {path}:{number}: not a JSON object, ignored", file=sys.stderr)
    return lines


def finished_keys(lines: list[dict], gpu_name: str) -> set[str]:
    """Keys of cases finished (ok or oom) in sections whose header names ``gpu_name``."""
    keys, current = set(), None
    for line in lines:
        if line.get("type") == "header":
            current = line.get("gpu_name")
        elif line.get("type") == "case" and current == gpu_name and line.get("status") in FINISHED:
            keys.add(line["key"])
    return keys


def _check_header(lines: list[dict], header: dict, path: Path, new_section: bool) -> None:
    headers = [line for line in lines if line.get("type") == "header"]
    if not headers or headers[-1].get("gpu_name") == header["gpu_name"] or new_section:
        return
    raise RunError(f"{path} holds measurements from {headers[-1].get('gpu_name')!r}, but this machine's GPU is "
                   f"{header['gpu_name']!r}. Write to another --out file, or pass --new-section (new_section=True) "
                   "to append a section for this GPU.")


def case_record(case: Case, status: str, result: dict | None = None, error: str | None = None) -> dict:
    """One JSONL case line: the case, its status, and the measurement (None everywhere it was not measured)."""
    record = {"type": "case", "key": case.key, **case.model_dump(), "status": status, "error": error}
    record.update({name: None for name in METRIC_FIELDS})
    record.update({"energy_available": False, "tokens": case.tokens})
    record.update(result or {})
    return record


def quarantine_torn_tail(path: Path) -> None:
    """A run killed mid-write leaves a last line without its newline: move it to ``PATH.torn`` and cut it off, so
    the next line written starts on a line of its own (never glued onto the torn one)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        cut = data.rfind(b"\n") + 1
        with open(path.with_name(path.name + ".torn"), "ab") as torn:
            torn.write(data[cut:] + b"\n")
        f.truncate(cut)
    print(f"warning: {path}: a torn last line moved to {path.name}.torn", file=sys.stderr)


class _Writer:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        quarantine_torn_tail(path)
        self.file = open(path, "a")
        self.lines = 0

    def write(self, line: dict) -> None:
        self.file.write(json.dumps(line, default=str) + "\n")
        self.file.flush()
        self.lines += 1

    def close(self) -> None:
        self.file.close()


def _run_local_group(cases: list[Case], settings: MeasureSettings, device, deadline: float | None, emit) -> bool:
    """Measure a single-device group in this process. Returns True if the time budget stopped it."""
    from .measure import build_model, measure_case

    first = cases[0]
    try:
        bm = build_model(first.model, first.dtype, device, seed=settings.seed)
    except Exception as exc:  # noqa: BLE001 - recorded for every case of the group
        status, message, fatal = _outcome(exc)
        bm = None
    if bm is None:
        for case in cases:
            emit(case, status, error=message)
        _after_case(fatal, message)
        return False
    try:
        for case in cases:
            if deadline is not None and time.time() >= deadline:
                return True
            result, status, message, fatal = None, "ok", None, False
            try:
                result = measure_case(bm, case, settings)
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                status, message, fatal = _outcome(exc)
            emit(case, status, result=result, error=message)
            _after_case(fatal, message)
    finally:
        del bm
        _after_case(False, None, quiet=True)
    return False


def _outcome(exc: BaseException) -> tuple[str, str, bool]:
    from .distributed import classify_error, is_fatal_device_error

    status, message = classify_error(exc)
    return status, message, is_fatal_device_error(exc)


def _after_case(fatal: bool, message: str | None, quiet: bool = False) -> None:
    """Free memory after a case; after a fatal CUDA error stop the run (the context cannot be used again)."""
    from .measure import free_memory

    if fatal:
        raise DeviceLost(f"CUDA error, the run stops here (rerun with the same --out to continue): {message}")
    try:
        free_memory()
    except Exception as exc:  # noqa: BLE001 - a sticky CUDA error surfaces here
        if quiet:
            return
        raise DeviceLost(f"CUDA error, the run stops here (rerun with the same --out to continue): {exc}") from None


def _log_case(case: Case, status: str, result: dict | None, error: str | None) -> None:
    """One line per case on stderr (when the progress bar is off, e.g. in a log file)."""
    r = result or {}
    detail = (f"{r['runtime_ms_median']:.3f} ms, {r.get('peak_memory_gb') or 0:.2f} GB, "
              f"{r.get('avg_power_w') or 0:.0f} W, {r.get('case_s', 0):.1f} s" if status == "ok" else error)
    print(f"[{time.strftime('%H:%M:%S')}] {case.key}: {status} ({detail})", file=sys.stderr, flush=True)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=False)


def run_suite(suite_path: str | Path, out_jsonl: str | Path, *, gpus: list[int] | None = None,
              device_name: str | None = None, max_minutes: float | None = None, new_section: bool = False,
              only: str | None = None, settings: MeasureSettings | None = None, progress: bool = True,
              host: bool = True) -> dict:
    """Measure every unfinished case of a suite, appending to ``out_jsonl``; returns counts per status.

    gpus: CUDA device indices to use (rank r of a TP case uses gpus[r]); default all. device_name: the GPU
    name to record (default torch's name; 'cpu' without CUDA). only: run just the cases whose key contains
    this text. settings: override the suite's MeasureSettings. host: record this machine's eager CPU costs
    (validation/host.py, a ``type: host`` line) before the first and after the last case of a single-GPU CUDA
    run, for reports that estimate with the host the run had. Raises RunError on a GPU-name mismatch with
    the file's last header unless new_section.
    """
    from .distributed import run_tp_group
    from .gpu import environment_header, set_safe_env, torch_device

    set_safe_env()
    if max_minutes is not None and not (math.isfinite(max_minutes) and max_minutes >= 0):
        raise RunError(f"--max-minutes must be a finite number of minutes, 0 or more (got {max_minutes})")
    suite = _load_suite(suite_path)
    settings = settings or suite.settings
    out = Path(out_jsonl)
    if out.is_dir():
        raise RunError(f"--out {str(out)!r} is a directory; give a JSONL file path")
    header = {**environment_header(gpus, device_name), "suite": suite.name, "settings": settings.model_dump()}
    lines = read_jsonl(out)
    _check_header(lines, header, out, new_section)
    _check_cuda(gpus, device_name)
    done = finished_keys(lines, header["gpu_name"])
    todo = [c for c in suite.cases if c.key not in done and (only is None or only in c.key)]
    counts = {s: 0 for s in STATUSES} | {"already_done": len(done & {c.key for c in suite.cases}),
                                         "stopped_by_budget": False, "aborted": None,
                                         "out": str(out)}
    deadline = time.time() + max_minutes * 60 if max_minutes is not None else None
    writer = _Writer(out)
    host = host and bool(todo) and device_name != "cpu" and all(c.tp == 1 for c in todo)
    host_start = _host_line("start") if host else None
    try:
        with _progress(progress) as bar:
            task = bar.add_task(suite.name, total=len(todo))

            def emit(case: Case, status: str, result: dict | None = None, error: str | None = None) -> None:
                if not writer.lines:
                    writer.write(header)   # a header only for a run that adds lines
                    if host_start is not None:
                        writer.write(host_start)
                writer.write(case_record(case, status, result, error))
                counts[status] += 1
                bar.update(task, advance=1, description=f"{case.key} [{status}]")
                if not progress:
                    _log_case(case, status, result, error)

            for group in group_cases(todo):
                if deadline is not None and time.time() >= deadline:
                    counts["stopped_by_budget"] = True
                    break
                bar.update(task, description=f"building {group[0].model} ({group[0].dtype}, tp={group[0].tp})")
                if group[0].tp > 1:
                    stopped = run_tp_group(group, settings, emit=emit, gpus=gpus, deadline=deadline)
                else:
                    try:
                        stopped = _run_local_group(group, settings, torch_device(gpus), deadline, emit)
                    except DeviceLost as exc:
                        counts["aborted"] = str(exc)
                        print(f"error: {exc}", file=sys.stderr)
                        break
                if stopped:
                    counts["stopped_by_budget"] = True
                    break
        if host and writer.lines and counts["aborted"] is None and not counts["stopped_by_budget"]:
            writer.write(_host_line("end"))
    finally:
        writer.close()
    return counts


def _host_line(when: str) -> dict:
    from .harness.common import host_record

    return host_record(when)


def _load_suite(path) -> Suite:
    """The suite, with a malformed file as one RunError line naming it."""
    import yaml
    from pydantic import ValidationError

    try:
        return load_suite(path)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors())
        raise RunError(f"{path}: not a valid suite: {fields}"[:500]) from None
    except (yaml.YAMLError, TypeError, AttributeError, KeyError, ValueError, RecursionError,
            UnicodeDecodeError) as exc:
        first = (str(exc).splitlines() or [""])[0][:200]
        raise RunError(f"{path}: not a valid suite ({type(exc).__name__}: {first})") from None
    except OSError as exc:
        raise RunError(str(exc) if exc.strerror is None else f"{path}: cannot be read ({exc.strerror})") from None


def _check_cuda(gpus: list[int] | None, device_name: str | None) -> None:
    """Measuring needs a CUDA GPU: without one, refuse (a CPU run builds multi-GB fp32 models and files CPU times
    as GPU measurements) unless the caller opts in with device_name='cpu'."""
    import torch

    if torch.cuda.is_available() or device_name == "cpu":
        return
    raise RunError("no CUDA GPU on this machine: a suite measures GPUs. Run it on the GPU host, or pass "
                   "--device-name cpu to measure on the CPU on purpose")


def _parse_gpus(text: str | None) -> list[int] | None:
    return [int(g) for g in text.split(",")] if text else None


app = new_app(__doc__.split("\n")[0])


@app.command()
def _runner(suite: Path = typer.Argument(..., help="suite YAML, e.g. validation/suites/h100.yaml"),
            out: Optional[Path] = typer.Option(None, help="JSONL to append to (default validation/data/<suite>.jsonl)"),
            gpus: Optional[str] = typer.Option(None, help="comma-separated CUDA device indices, e.g. 0,1"),
            device_name: Optional[str] = typer.Option(None, help="GPU name to record instead of torch's"),
            max_minutes: Optional[float] = typer.Option(None, help="stop cleanly between cases after this long"),
            new_section: bool = typer.Option(False, help="append even if the file is from another GPU"),
            only: Optional[str] = typer.Option(None, help="run only cases whose key contains this text"),
            no_progress: bool = typer.Option(False, "--no-progress")) -> int:
    target = out or Path("validation/data") / f"{load_suite(suite).name}.jsonl"
    counts = run_suite(suite, target, gpus=_parse_gpus(gpus), device_name=device_name, max_minutes=max_minutes,
                       new_section=new_section, only=only, progress=not no_progress)
    print(json.dumps(counts))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(app, argv, "python -m aisim.validation.runner")


if __name__ == "__main__":
    raise SystemExit(main())
