"""Speed benchmarks of the simulator; writes docs/performance.md.

    python benchmarks/bench_estimate.py [--out docs/performance.md]

An existing file keeps everything after its timing table (notes, the serving section); the head and the table are
rewritten.

Measures: a cold CLI estimate (new process; graph cache empty, then warm), a warm API estimate (in process),
tracing a 70B model, and a sweep over devices x batch sizes x dtypes. Each time is the median of repeats.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

CLI = [sys.executable, "-m", "aisim.cli", "estimate", "--model", "opt-6.7b", "--device", "a6000x8", "--json"]


def timed(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cli_cold(cache_dir: str, fresh: bool) -> float:
    def run():
        env = dict(os.environ, AISIM_CACHE_DIR=tempfile.mkdtemp() if fresh else cache_dir)
        subprocess.run(CLI, check=True, capture_output=True, env=env)
    return timed(run)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="docs/performance.md")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="aisim-bench-")
    os.environ["AISIM_CACHE_DIR"] = cache
    rows = []
    rows.append(("CLI estimate, new process, empty graph cache (opt-6.7b on a6000x8)", cli_cold(cache, True)))
    subprocess.run(CLI, check=True, capture_output=True, env=dict(os.environ, AISIM_CACHE_DIR=cache))
    rows.append(("CLI estimate, new process, graph cached on disk", cli_cold(cache, False)))

    import aisim
    from aisim.catalog import resolve_model
    from aisim.graph.extract import trace_workload
    from aisim.workload import ParallelPlan, Workload

    aisim.estimate(model="opt-6.7b", device="h100", batch=16, seq=1024)
    rows.append(("API estimate, warm (opt-6.7b forward 16x1024 on h100)",
                 timed(lambda: aisim.estimate(model="opt-6.7b", device="h100", batch=16, seq=1024), 10)))
    _, llama70 = resolve_model("Llama-2-70b-hf")
    rows.append(("trace Llama-2-70b forward 1x1024 (no cache)", timed(
        lambda: trace_workload(llama70, Workload(seq=1024), ParallelPlan(), use_cache=False))))
    rows.append(("trace Llama-2-70b forward-backward 1x1024 (no cache)", timed(
        lambda: trace_workload(llama70, Workload(phase="forward-backward", seq=1024), ParallelPlan(),
                               use_cache=False))))
    devices = ["h100", "h200", "a100", "a6000", "a5000", "l40s", "l4", "4090", "3090", "a10g"]
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    dtypes = ["fp16", "bf16"]
    configs = [(d, b, t) for d in devices for b in batches for t in dtypes]

    def sweep():
        for d, b, t in configs:
            aisim.estimate(model="Meta-Llama-3-8B", device=d, workload="decode", batch=b, seq=1024, dtype=t)
    t_first = timed(sweep, 1)
    t_warm = timed(sweep, 1)
    rows.append((f"sweep of {len(configs)} decode configurations (10 devices x 10 batches x 2 dtypes), first run",
                 t_first))
    rows.append((f"same sweep again (graphs cached): per configuration {1e3 * t_warm / len(configs):.1f} ms",
                 t_warm))
    speech = dict(model="whisper-medium.en", device="gtx-1650-mobile", workload="transcribe", audio_s=2107,
                  runtime="ggml-vulkan")
    rows.append(("transcribe whisper-medium.en, 2107 s of audio, first run (4 traces)",
                 timed(lambda: aisim.estimate(**speech), 1)))
    rows.append(("same transcribe, graphs cached", timed(lambda: aisim.estimate(**speech), 5)))
    limits = range(10, 50)
    rows.append((f"sweep of {len(limits)} power limits x 2 backends (transcribe, graphs cached)", timed(
        lambda: [aisim.estimate(**{**speech, "runtime": rt}, power_limit_w=w)
                 for rt in ("ggml-cuda", "ggml-vulkan") for w in limits], 1)))
    from aisim.api import serve_bench

    tgi = dict(model="bloomz-7b1-mt", device="a100", shards=[1, 2, 4, 8], batches=[1, 2, 4, 8, 16, 32], seq=1024)
    rows.append(("serve-bench bloomz-7b1-mt, 4 shard counts x 6 batches, first run",
                 timed(lambda: serve_bench(**tgi), 1)))
    rows.append(("same serve-bench, graphs cached", timed(lambda: serve_bench(**tgi), 3)))
    write(Path(args.out), rows)


CACHE_NOTE = ("A new process pays for importing torch and transformers when it must trace; graphs and filled model "
              "configs are cached on disk (`~/.cache/aisim/graphs`, `configs`, `AISIM_CACHE_DIR`) keyed by config, "
              "workload, plan, the torch and transformers versions and a hash of the graph-building source (JSON: "
              "nothing read back can execute), so a repeated estimate in a new process does not import them.")


def write(path: Path, rows) -> None:
    import torch
    import transformers

    lines = ["# Performance of the simulator", "",
             f"Measured by `python benchmarks/bench_estimate.py` on {date.today().isoformat()}: "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, Python "
             f"{platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}. "
             "Each time is a median over repeats (sweeps: one run each).", "",
             "| what | wall time (s) |", "|---|---:|"]
    lines += [f"| {name} | {seconds:.3f} |" for name, seconds in rows]
    table = "\n".join(lines)
    # only the head and the table are rewritten: the notes and the other sections below them are kept
    old = path.read_text() if path.is_file() else ""
    if "| what | wall time (s) |" in old:
        rest = old.split("| what | wall time (s) |", 1)[1].split("\n")
        while rest and (not rest[0] or rest[0].startswith("|")):
            rest.pop(0)
        text = table + "\n\n" + "\n".join(rest)
    else:
        text = table + "\n\n" + CACHE_NOTE + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(table)


if __name__ == "__main__":
    main()
