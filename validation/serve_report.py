"""Serving runs of transformers' continuous batching engine, measured vs `aisim serve` (the serve-cb reference).

    python -m aisim.validation.serve_report [--format markdown|json]     (or: aisim validate --reference serve-cb)

Each measured run (validation/data/serve/cb-*.jsonl, written by validation/harness/serve_cb.py) is replayed as a
trace: every request's submit time, prompt length and output length (EOS disabled, so every request produced
exactly its length). aisim simulates it with --runtime transformers-cb on the measured GPU, and the vLLM-style
metrics are compared: output throughput, TTFT and TPOT (median and p90). Nothing is fitted to these runs.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from .cli import emit, new_app, run
from .report import paired_mape_pct

DATA = Path(__file__).parent / "data" / "serve"
CONFIGS = Path(__file__).parent / "harness" / "configs"
MODELS = {"qwen2.5-1.5b": Path(__file__).parent / "harness" / "configs" / "qwen2.5-1.5b.json",
          "Meta-Llama-3-8B": "Meta-Llama-3-8B",
          "olmoe-1b-7b": Path(__file__).parent / "harness" / "configs" / "olmoe-1b-7b.json"}
DEVICES = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200"}
METRICS = (("output_throughput", "output tok/s"), ("median_ttft_ms", "median TTFT ms"),
           ("p90_ttft_ms", "p90 TTFT ms"), ("median_tpot_ms", "median TPOT ms"), ("p90_tpot_ms", "p90 TPOT ms"))
# Regression ceilings, MAPE % over the runs: the value of the commit that set them plus half a point, as
# validation/accuracy.py CEILINGS; tests/test_serve_cli.py fails a change that worsens one. Lower one when accuracy
# improves; raise one only with the reason in the commit message.
GOALS_PCT = {"output_throughput": 10.0, "median_tpot_ms": 10.0, "median_ttft_ms": 25.0}   # the serving issue
# median TTFT 16.1 -> 16.4 on 2026-11-27 (15.9 -> 16.2%): a cat reads its own measured curve
# (memory_op_efficiency), slower than the median curve at the prefill's mid sizes on the H100
CEILINGS_PCT = {"output_throughput": 5.8, "median_ttft_ms": 16.4, "p90_ttft_ms": 16.4, "median_tpot_ms": 6.5,
                "p90_tpot_ms": 7.2}


def measured_runs(path: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    header = next(x for x in lines if x.get("type") == "header")
    return header, [x for x in lines if x.get("type") == "run" and x.get("status") == "ok"]


def _per_request_ms(run_: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each measured request's TTFT and TPOT (NaN with one output token), from its token timestamps."""
    reqs = run_["requests"]
    ttft = np.array([r["tok"][0] - r["sub"] for r in reqs], dtype=float)
    tpot = np.array([(r["tok"][-1] - r["tok"][0]) / (len(r["tok"]) - 1) if len(r["tok"]) > 1 else np.nan
                     for r in reqs], dtype=float)
    return ttft, tpot


def _measured_metrics(run_: dict) -> dict[str, float]:
    """vLLM bench-serve definitions over the measured per-request token timestamps."""
    reqs = run_["requests"]
    ttft, tpot = _per_request_ms(run_)
    tpot = tpot[~np.isnan(tpot)]
    duration_s = (max(r["tok"][-1] for r in reqs) - min(r["sub"] for r in reqs)) / 1e3
    return {"output_throughput": sum(len(r["tok"]) for r in reqs) / duration_s,
            "median_ttft_ms": float(np.median(ttft)), "p90_ttft_ms": float(np.percentile(ttft, 90)),
            "median_tpot_ms": float(np.median(tpot)), "p90_tpot_ms": float(np.percentile(tpot, 90))}


def _trace(run_: dict, folder: Path) -> Path:
    start = min(r["sub"] for r in run_["requests"])
    path = folder / f"{run_['model']}-{run_['mode']}-{run_.get('rate_req_s')}.csv"
    rows = ["arrival_s,input_tokens,output_tokens"] + [
        f"{(r['sub'] - start) / 1e3:.6f},{r['in']},{len(r['tok'])}" for r in run_["requests"]]
    path.write_text("\n".join(rows) + "\n")
    return path


def _estimated_metrics(model: str, device: str, trace: Path) -> dict[str, float]:
    from ..scenario import scenario
    from ..studies.serve import ServeRequest
    from ..studies.serve.run import serve

    sc = scenario(model, device, dtype="bf16", runtime="transformers-cb")
    result = serve(sc, ServeRequest(trace_path=trace, metric_percentiles=[90.0]))[0].result
    flat = result.flat()
    return {**{k: flat[k] for k, _ in METRICS}, "j_per_output_token": result.energy_j_per_output_token}


def compare_runs(pattern: str = "cb-*.jsonl") -> list[dict]:
    """Each measured serving run of the files matching ``pattern`` (the scored runs by default) against aisim serve
    replaying its trace."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(DATA.glob(pattern)):
            header, runs = measured_runs(path)
            device = DEVICES[header["gpu_name"]]
            for r in runs:
                measured = {**_measured_metrics(r),
                            "j_per_output_token": (r.get("energy") or {}).get("j_per_output_token")}
                estimated = _estimated_metrics(str(MODELS[r["model"]]), device, _trace(r, Path(tmp)))
                rows.append({"model": r["model"], "device": device, "mode": r["mode"], "rate": r.get("rate_req_s"),
                             "requests": len(r["requests"]), "measured": measured, "estimated": estimated,
                             "error": {k: (estimated[k] - measured[k]) / measured[k] for k, _ in METRICS},
                             "source": f"validation/data/serve/{path.name}", "gpu": header["gpu_name"],
                             "driver": header.get("driver"), "torch": header.get("torch"),
                             "transformers": header.get("transformers")})
    return rows


def _run_name(r: dict) -> str:
    return r["mode"] + (f" {r['rate']:g} req/s" if r["rate"] else "")


def _runs_table(rows: list[dict], with_model: bool = True) -> list[str]:
    """Markdown table of compare_runs rows: each metric measured / aisim / error, with a model column or not."""
    model = ("| Model ", "| :--- ") if with_model else ("", "")
    out = [model[0] + "| Run | n | " + " | ".join(f"{label} (meas / aisim / err)" for _, label in METRICS) + " |",
           model[1] + "| :--- | ---: | " + " | ".join("---:" for _ in METRICS) + " |"]
    for r in rows:
        run_name = _run_name(r)
        cells = [f"{r['measured'][k]:.1f} / {r['estimated'][k]:.1f} / {100 * r['error'][k]:+.1f}%" for k, _ in METRICS]
        out.append((f"| {r['model']} " if with_model else "") + f"| {run_name} | {r['requests']} | "
                   + " | ".join(cells) + " |")
    return out


def serve_section(rows: list[dict] | None = None) -> list[str]:
    """Markdown lines for docs/accuracy.md."""
    rows = compare_runs() if rows is None else rows
    out = _runs_table(rows)
    out += ["", "| Metric | MAPE over the runs | Regression ceiling |", "| :--- | ---: | ---: |"]
    mape = mape_pct(rows)
    for k, label in METRICS:
        out.append(f"| {label} | {mape[k]:.1f}% | {CEILINGS_PCT[k]:g}% |")
    labels = dict(METRICS)
    missed = [labels[k] for k, goal in GOALS_PCT.items() if mape[k] > goal]
    out += ["", "Goals (serving issue): " + ", ".join(f"{labels[k]} within {goal:g}% ({mape[k]:.1f}%)"
                                                    for k, goal in GOALS_PCT.items())
            + ": " + ("met." if not missed else "missed: " + ", ".join(missed) + ".")]
    energy = [(r, r["measured"]["j_per_output_token"], r["estimated"]["j_per_output_token"]) for r in rows
              if r["measured"].get("j_per_output_token")]
    if energy:
        out += ["", "Energy per output token, not scored (the runs' NVML energy over the run / output tokens, "
                "measured / aisim): " + "; ".join(
                    f"{r['model']} {_run_name(r)} {m:.3f} / {e:.3f} J" for r, m, e in energy)
                + f" (MAPE {paired_mape_pct([e for _, _, e in energy], [m for _, m, _ in energy]):.1f}%; aisim "
                f"lower on {sum(e < m for _, m, e in energy)} of {len(energy)} runs). aisim charges a step's "
                "forward and the engine's per-step host work at the forward's power and an attention graph build at "
                "the GPU's waiting power (the calibration's active idle). " + build_power_line()]
    return out


BUILD_POWER = Path(__file__).parent / "data" / "kernels" / "build-power-h100.jsonl"


def build_power_line() -> str:
    """What the GPU draws while the host builds cuDNN graphs (harness/build_power.py), median over rounds."""
    if not BUILD_POWER.is_file():
        return ""
    lines = [json.loads(x) for x in BUILD_POWER.read_text().splitlines() if x.strip()]
    header = lines[0]
    watts = {loop: statistics.median(r["avg_power_w"] for r in lines if r.get("loop") == loop and r.get("avg_power_w"))
             for loop in ("build", "idle", "repeat")}
    ms = statistics.median(r["wall_ms_per_call"] for r in lines if r.get("loop") == "build")
    return (f"Measured ({BUILD_POWER.relative_to(BUILD_POWER.parents[3])}: harness/build_power.py, "
            f"{header.get('gpu_name')}, {str(header.get('date', ''))[:10]}): while the host builds a graph "
            f"({ms:.1f} ms a call) the GPU draws {watts['build']:.1f} W, idle {watts['idle']:.1f} W, the cached "
            f"call back to back {watts['repeat']:.1f} W: the build is idle time, so the shortfall is the steps' "
            "own power (not established).")


def step_mix_rows(pattern: str = "cb-*.jsonl") -> list[dict]:
    """The engine's isolated steps (serve_cb's step_mix records: decode rows x context, prompt chunks, their mixes)
    against aisim serve's step timer for the same batch, less the timer's scheduler loop (which the isolated step
    does not run): measured = preparation + forward (total_ms_median)."""
    from aisim.scenario import scenario
    from aisim.studies.serve.steptime import BatchShape
    from aisim.studies.serve.timer import StepCostTimer

    out = []
    for path in sorted(DATA.glob(pattern)):
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        header = lines[0]
        model = next((r["model"] for r in lines if r.get("type") == "model"), None)
        if model not in MODELS:
            continue
        sc = scenario(str(MODELS[model]), DEVICES.get(header.get("gpu_name"), "h100"), dtype="bf16",
                      runtime="transformers-cb")
        timer, serving = StepCostTimer(sc, 8192), sc.runtime.serving
        for r in lines:
            if r.get("type") != "step_mix" or r.get("status") != "ok":
                continue
            rows, chunks = r["decode_rows"], r["prefill_chunks"]
            # the decode rows' KV tokens as the engine read them, each row's new token included (BatchShape)
            shape = BatchShape(prefill_tokens=sum(chunks), prefill_attn_pairs=float(sum(c * c for c in chunks)),
                               prefill_seqs=len(chunks), decode_seqs=rows,
                               decode_ctx_tokens=float(r["kv_tokens_read"] + rows) if rows else 0.0,
                               prefill_ctx_tokens=float(sum(chunks)))
            loop_s = serving.scheduler_overhead_s + serving.scheduler_overhead_per_seq_s * shape.seqs
            est_ms = (timer.step_time_s(shape) - loop_s) * 1e3
            out.append({"model": model, "mix": r["mix"], "measured_ms": r["total_ms_median"], "estimated_ms": est_ms,
                        "error": (est_ms - r["total_ms_median"]) / r["total_ms_median"],
                        "step_ms": r.get("step_ms", [])})
    return out


def step_mix_lines(rows: list[dict] | None = None) -> list[str]:
    """Markdown: the isolated engine steps, measured vs aisim, and MAPE per model."""
    rows = step_mix_rows() if rows is None else rows
    if not rows:
        return []
    out = ["The engine's isolated steps at several batch mixes (serve_cb's step_mix records in the same files: dN x C "
           "= N decoding requests at context C, pN = a prompt chunk of N tokens; measured = the step's batch "
           "preparation + forward, median of 8), against aisim serve's step timer for the same batch less its "
           "scheduler loop, which an isolated step does not run. Not a goal of the issue; it asked for the "
           "measurement, which feeds the serving simulator:", "",
           "| Model | Mix | measured ms | aisim ms | error |", "| :--- | :--- | ---: | ---: | ---: |"]
    out += [f"| {r['model']} | {r['mix']} | {r['measured_ms']:.2f} | {r['estimated_ms']:.2f} | "
            f"{100 * r['error']:+.1f}% |" for r in rows]
    by_model: dict[str, list[float]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(abs(r["error"]))
    out += ["", "MAPE " + ", ".join(f"{m} {100 * sum(v) / len(v):.1f}% ({len(v)} mixes)" for m, v in by_model.items())
            + ". qwen2.5-1.5b's small decode steps (1-64 requests at 256 tokens, 1-8 at 1024) take 43-53 ms "
            "measured, longer than Llama-3-8B's, where aisim says 25-32 ms (-40%); its larger decode steps are "
            "within 8%, its decode steps with a prompt chunk 19-21% short, its prompt-only steps within 1-7%. The "
            "engine allocated qwen2.5-1.5b a larger KV cache and attention mask (1.49M tokens and 24.5 GB, against "
            "0.38M and 6.4 GB: the step_mix_engine records); the cause of the missing 15-20 ms is not established "
            "and it is not modelled."]
    return out


MOE_PATTERN = "cbmoe-*.jsonl"
# aisim as committed in 5626185, before the OLMoE run (recorded after it, from that tree): (mode, rate) -> metric ->
# value, and mix -> step ms. Then the timer left out the K / V copies of a model with as many KV heads as query heads
PREDICTED_MOE = {
    ("offline", None): {"output_throughput": 798.32, "median_ttft_ms": 1278.44, "p90_ttft_ms": 2350.89,
                        "median_tpot_ms": 103.62, "p90_tpot_ms": 117.69},
    ("poisson", 4.0): {"output_throughput": 351.23, "median_ttft_ms": 111.57, "p90_ttft_ms": 141.64,
                       "median_tpot_ms": 74.01, "p90_tpot_ms": 74.81},
    ("poisson", 16.0): {"output_throughput": 447.76, "median_ttft_ms": 128.75, "p90_ttft_ms": 156.19,
                        "median_tpot_ms": 78.16, "p90_tpot_ms": 80.54}}
PREDICTED_MOE_STEP_MS = {"d1x256": 25.17, "d8x256": 26.09, "d32x256": 28.45, "d64x256": 31.59, "d1x1024": 25.21,
                       "d8x1024": 26.42, "d32x1024": 29.99, "d64x1024": 49.01, "p256": 25.41, "p1024": 25.45,
                       "p2048": 34.44, "p4x1024": 63.31, "p8x1024": 135.95, "p512+d32x1024": 32.38,
                       "p2048+d64x1024": 103.39}
MOE_STEP_CEILING_PCT = 10.2   # OLMoE's isolated steps, MAPE (9.7% when set, plus half a point)


def moe_serve_lines() -> list[str]:
    """Markdown: transformers' continuous batching serving an MoE model (OLMoE-1B-7B), out of sample: the runs and the
    isolated steps against aisim as it stands and as committed before the run (not in the scored table above)."""
    rows = compare_runs(MOE_PATTERN)
    if not rows:
        return []
    first = rows[0]
    out = [f"An MoE model served the same way, out of sample ({first['source']}: {first['gpu']}, driver "
           f"{first['driver']}, torch {first['torch']}, transformers {first['transformers']}; "
           f"{first['model']}, random bf16 weights, grouped-GEMM experts, the harness's default runs and step "
           "mixes), replayed through `aisim serve --runtime transformers-cb`; not in the scored table.", "",
           *_runs_table(rows, with_model=False)]
    mape = mape_pct(rows)
    predicted = {k: paired_mape_pct([PREDICTED_MOE[r["mode"], r["rate"]][k] for r in rows],
                                    [r["measured"][k] for r in rows]) for k, _ in METRICS}
    steps = step_mix_rows(MOE_PATTERN)
    out += ["", "MAPE " + ", ".join(f"{label} {mape[k]:.1f}%" for k, label in METRICS) + " (the dense runs' goals: "
            + ", ".join(f"{dict(METRICS)[k]} {goal:g}%" for k, goal in GOALS_PCT.items()) + "). Predicted (aisim as "
            "committed in 5626185 before the run; values in serve_report.PREDICTED_MOE): "
            + ", ".join(f"{label} {predicted[k]:.1f}%" for k, label in METRICS) + "."]
    if steps:
        measured = [r["measured_ms"] for r in steps]
        now = paired_mape_pct([r["estimated_ms"] for r in steps], measured)
        before = paired_mape_pct([PREDICTED_MOE_STEP_MS[r["mix"]] for r in steps], measured)
        ttft = [100 * r["error"][k] for r in rows for k in ("median_ttft_ms", "p90_ttft_ms")]
        by_mix = {r["mix"]: r for r in steps}
        mix = by_mix["d32x1024"]
        fast = [t for t in mix["step_ms"] if t < 1.1 * min(mix["step_ms"])]
        slow = [t for t in mix["step_ms"] if t >= 1.1 * min(mix["step_ms"])]
        missed = ", ".join(f"{name} {100 * (PREDICTED_MOE_STEP_MS[name] / by_mix[name]['measured_ms'] - 1):+.0f}%"
                           for name in ("d32x1024", "d64x1024"))
        from aisim.specs import load_calibration

        copy = load_calibration("h100-sxm").view_copy_efficiency
        out[-1] += (f" Its isolated steps (same mixes as above): MAPE {before:.1f}% predicted over {len(steps)} "
                    f"mixes, {now:.1f}% now. The prediction missed the steps that read 32k-64k cached keys "
                    f"({missed}): with as many KV heads as query heads, sdpa_paged.py's repeat_kv "
                    "returns the transposed view of the keys and values it read, and key.contiguous() / "
                    "value.contiguous() copy it (lines 12-13, 56-58), where a GQA model copies in repeat_kv's "
                    "reshape instead; the timer counted the copy only for GQA. A kernel profile of the engine's "
                    "32 x 1024 decode step on an H100 (validation/data/profiles/cbmoe-olmoe-1b-7b-profile.txt, "
                    "serve_cb --profile-steps, run after the serving runs on another machine) has 32 such key / "
                    "value copies per step, about 0.18 ms each for 268 MB read and written (45% of HBM bandwidth): "
                    "PyTorch's generic copy out of a view whose head_dim rows stay contiguous, which the timer now "
                    f"prices at the calibration's view_copy_efficiency ({copy:.3f} of datasheet bandwidth on H100, "
                    "the eager_attention microbenchmark's crop-and-copy rows: derive_eager_attention), not at the "
                    "strided-operand curve that GQA's expanded copies match. The profiled step took 38.5 ms with "
                    f"its batch preparation; the step mix's {len(mix['step_ms'])} samples of it were two-speed "
                    f"({_span_ms(fast)} ms for the first {len(fast)}, {_span_ms(slow)} ms after, the host's "
                    f"preparation slowing with them), median {mix['measured_ms']:.1f} ms with the preparation; "
                    f"aisim {mix['estimated_ms']:.1f}. Still short: "
                    f"TTFT ({min(ttft):+.0f} to {max(ttft):+.0f}% over the runs) and the 4 req/s run's TPOT, the "
                    "Qwen2.5-1.5B runs' pattern above.")
    return out


def _span_ms(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


def mape_pct(rows: list[dict]) -> dict[str, float]:
    """Mean absolute percentage error of each metric over the runs."""
    return {k: 100 * sum(abs(r["error"][k]) for r in rows) / len(rows) for k, _ in METRICS}


def ceiling_violations(rows: list[dict] | None = None) -> list[str]:
    """Every metric whose MAPE is over its regression ceiling (CEILINGS_PCT), or all if there are no runs."""
    rows = compare_runs() if rows is None else rows
    if not rows:
        return ["serve-cb: no measured runs"]
    mape = mape_pct(rows)
    return [f"serve-cb: {k}: MAPE {mape[k]:.2f}% > ceiling {CEILINGS_PCT[k]:g}%" for k, _ in METRICS
            if mape[k] > CEILINGS_PCT[k]]


app = new_app(__doc__.split("\n")[0])


@app.command()
def _report(fmt: str = typer.Option("markdown", "--format", help="markdown|json"),
            out: Optional[Path] = typer.Option(None, help="write here instead of stdout")) -> int:
    rows = compare_runs()
    text = json.dumps(rows, indent=1) if fmt == "json" else "\n".join(serve_section(rows)) + "\n"
    return emit(text, out)


def main(argv: list[str] | None = None) -> int:
    return run(app, argv, "python -m aisim.validation.serve_report")


if __name__ == "__main__":
    raise SystemExit(main())


SLIDING_RUNS = (("qwen2.5-1.5b", 160, "cbsw-qwen2.5-1.5b-full-h100.jsonl"),
                ("qwen2.5-1.5b-sw256", 320, "cbsw-qwen2.5-1.5b-sw320-h100.jsonl"),
                ("qwen2.5-1.5b-sw256", 160, "cbsw-qwen2.5-1.5b-sw160-h100.jsonl"))
SLIDING_PREDICTED = "cbsw-qwen2.5-1.5b-predicted.jsonl"


def sliding_window_rows() -> list[dict]:
    """The KV-bound serving runs of the full-attention model and its hybrid sliding-window variant: measured, aisim
    as committed before the run (the predictions file), and aisim now with the engine's resolved max_batch_tokens."""
    from aisim.scenario import scenario
    from aisim.studies.serve import ServeRequest
    from aisim.studies.serve.run import serve

    predicted = {(p["model"], p["num_blocks"]): p for p in map(json.loads, (DATA / SLIDING_PREDICTED).read_text()
                                                               .splitlines()) if p.get("type") == "prediction"}
    rows = []
    for model, blocks, name in SLIDING_RUNS:
        path = DATA / name
        if not path.is_file():
            continue
        header, runs = measured_runs(path)
        run_ = runs[0]
        engine = run_["engine"]
        sc = scenario(str(CONFIGS / f"{model}.json"), "h100", runtime="transformers-cb", dtype="bf16")
        request = ServeRequest(num_requests=run_["n"], input_len=str(run_["in_range"][0]),
                               output_len=str(run_["out_range"][0]))
        knobs = {"block_size": engine["block_size"], "num_gpu_blocks_override": engine["num_blocks"],
                 "max_num_batched_tokens": engine["max_batch_tokens"]}
        served = serve(sc, request, knobs)[0]
        result = served.result
        summary = run_["summary"]
        measured_ttft, measured_tpot = _per_request_ms(run_)
        rows.append({"model": model, "blocks": blocks, "source": name, "header": header,
                     "measured": {**_measured_metrics(run_), "batch": summary["mean_requests_per_step"]},
                     "estimated": {"output_throughput": result.output_throughput,
                                   "median_ttft_ms": result.median_ttft_ms, "median_tpot_ms": result.median_tpot_ms,
                                   "batch": result.mean_running_batch_size},
                     "predicted": predicted.get((model, blocks), {}), "max_batch_tokens": engine["max_batch_tokens"],
                     "waves": {"measured": _wave_tpot(measured_ttft, measured_tpot),
                               "estimated": _wave_tpot(served.requests.ttft_ms, served.requests.tpot_ms)}})
    return rows


# serve_cb --profile-steps at the KV-bound runs' decode shape (32 requests of 1088 tokens, the full-attention run's
# engine settings: num_blocks 160, safety_margin 0), isolated steps at a repeated shape, H100, 2026-11-27
ISOLATED_PROFILE = Path(__file__).parent / "data" / "profiles" / "cb-qwen2.5-1.5b-profile-ctx1088.jsonl"


def isolated_step_line() -> str:
    """The KV-bound decode step isolated (repeated shape: its cuDNN graph built) against the same shape inside the
    full-attention serving run and against aisim."""
    from aisim.scenario import scenario
    from aisim.studies.serve.steptime import BatchShape
    from aisim.studies.serve.timer import StepCostTimer

    if not ISOLATED_PROFILE.is_file():
        return ""
    records = [json.loads(x) for x in ISOLATED_PROFILE.read_text().splitlines() if x.strip()]
    summary = next(r["summary"] for r in records if r.get("type") == "profile_phases"
                   and r.get("part") == "isolated" and r.get("shape") == "d32")
    engine = next(r["engine"] for r in records if r.get("type") == "profile_engine")
    n, kv = int(summary["requests"]), int(summary["kv_read"])
    _, runs = measured_runs(DATA / SLIDING_RUNS[0][2])
    steps = runs[0]["steps"]   # start_ms, step_ms, requests, q_tokens, decode_requests, kv_tokens_read
    cycles = [(nxt[0] - cur[0], cur[1]) for cur, nxt in zip(steps, steps[1:]) if cur[3] == n and cur[5] == kv]
    timer = StepCostTimer(scenario(str(CONFIGS / f"{SLIDING_RUNS[0][0]}.json"), "h100", runtime="transformers-cb",
                                   dtype="bf16"), engine["max_batch_tokens"])
    shape = BatchShape(0, 0.0, 0, n, float(kv))
    total_ms = timer.step_time_s(shape) * 1e3
    forward_ms = total_ms - timer._host_s(shape) * 1e3
    later = cycles[1:]
    return (f"The same decode shape in isolation ({ISOLATED_PROFILE.relative_to(ISOLATED_PROFILE.parents[3])}: "
            f"serve_cb --profile-steps, {n} requests of {kv // n} tokens, the run's engine settings, the shape "
            f"repeated so its graph is built): forward {summary['step_ms']:.1f} ms, cycle {summary['cycle_ms']:.1f} "
            f"ms; aisim {forward_ms:.1f} / {total_ms:.1f}. Inside the full-attention serving run the steps at that "
            f"shape took {cycles[0][1]:.1f} / {cycles[0][0]:.1f} ms in the first wave (graph built there) and "
            + ", ".join(f"{step:.1f} / {cycle:.1f}" for cycle, step in later)
            + f" ms in the later waves: aisim's kernels and host costs hold for the isolated step, and inside the "
            f"serving run the same step's forward takes {np.mean([step for _, step in later]) - summary['step_ms']:.1f}"
            " ms more. Why is not established (candidates: the harness's thread recording every token beside the "
            "engine's, a served cache's scattered pages); not modelled.")


def _wave_tpot(ttft_ms: np.ndarray, tpot_ms: np.ndarray) -> tuple[float, float]:
    """(median TPOT of the first wave: the requests whose first token came with the earliest, within 5%; median
    TPOT of the others)."""
    first = ttft_ms <= np.nanmin(ttft_ms) * 1.05
    return float(np.nanmedian(tpot_ms[first])), float(np.nanmedian(tpot_ms[~first])) if (~first).any() else np.nan


def sliding_window_lines() -> list[str]:
    """Markdown: the sliding-window KV pool checked on transformers' continuous batching (not a scored table)."""
    rows = sliding_window_rows()
    if not rows:
        return []
    h = rows[0]["header"]
    head = ["run", "KV blocks", "requests per step measured / predicted / now", "output tok/s measured / "
            "predicted / now", "median TTFT ms measured / predicted / now", "median TPOT ms measured / predicted / now"]
    table = ["| " + " | ".join(head) + " |", "|---|---:|---|---|---|---|"]
    for r in rows:
        m, p, e = r["measured"], r["predicted"], r["estimated"]
        cells = [f"{r['model']} (`{r['source']}`)", str(r["blocks"]),
                 f"{m['batch']:.2f} / {p.get('mean_running_batch_size', float('nan')):.2f} / {e['batch']:.2f}"]
        for k, fmt in (("output_throughput", "{:.0f}"), ("median_ttft_ms", "{:.0f}"), ("median_tpot_ms", "{:.1f}")):
            cells.append(" / ".join(fmt.format(v) for v in (m[k], p.get(k, float("nan")), e[k])))
        table.append("| " + " | ".join(cells) + " |")
    batch = paired_mape_pct([r["estimated"]["batch"] for r in rows], [r["measured"]["batch"] for r in rows])
    tput = paired_mape_pct([r["estimated"]["output_throughput"] for r in rows],
                           [r["measured"]["output_throughput"] for r in rows])
    tpot = paired_mape_pct([r["estimated"]["median_tpot_ms"] for r in rows],
                           [r["measured"]["median_tpot_ms"] for r in rows])
    return [f"Sliding-window layers in the KV pool (validation/data/serve/cbsw-*.jsonl: {h.get('gpu_name')}, driver "
            f"{h.get('driver')}, torch {h.get('torch')}, transformers {h.get('transformers')}, "
            f"{str(h.get('date', ''))[:10]}). transformers' continuous batching serving 128 requests of 1024 + 256 "
            "tokens at once with a KV pool small enough to bind (serve_cb --cb-json num_blocks, block_size 256, "
            "safety_margin 0), for Qwen2.5-1.5B and for the same model with Qwen2's sliding window on "
            "(validation/harness/configs/qwen2.5-1.5b-sw256.json: layers 14-27 windowed at 256 tokens; one engine "
            "block then holds 14 layers, so 320 blocks are the full model's 160 in memory). Predicted: "
            f"{SLIDING_PREDICTED}, `aisim serve --num-gpu-blocks-override` as committed before the run, with "
            "transformers-cb's max_num_batched_tokens 8192; now: the same with the engine's resolved "
            "max_batch_tokens (" + ", ".join(str(r["max_batch_tokens"]) for r in rows) + ": the engine sizes it "
            "from the memory the small pool leaves). Not a scored table.", "", *table, "",
            f"The pool's concurrency is what the model says (requests per step, MAPE {batch:.1f}%): a windowed layer "
            "holds one block of a request (ceil(256 / 256)), so a request takes 5 + 1 of the windowed model's "
            "blocks against 5 of the full model's, and 42.7 requests run at once on the same memory where 32 did. "
            f"Output tok/s MAPE {tput:.1f}%, median TPOT {tpot:.1f}%. The requests run in waves of equal lengths, "
            "and a later wave's decode steps come back to the (queries, keys) counts whose cuDNN SDPA graphs the "
            "first wave's steps built (transformers-cb.yaml attention_graph_build_s: built once per shape per "
            "engine); median TPOT of the first wave / of the later requests, measured against aisim: "
            + "; ".join(f"{r['model']} {r['blocks']} blocks {m0:.1f} / {m1:.1f} ms against {e0:.1f} / {e1:.1f}"
                        for r in rows for (m0, m1), (e0, e1) in [(r["waves"]["measured"],
                                                                  r["waves"]["estimated"])])
            + ". Not modelled from transformers: its safety_margin (0 here).", "", isolated_step_line()]
