"""Published tables (validation/references/*.yaml) estimated row by row with aisim, out of sample.

``aisim validate --reference torchcap|cs336`` prints Measured | aisim estimate | Error (and TorchCAP's own
estimate and error beside ours) as an RST grid, markdown, CSV or JSON, with MAPE and max error. Error is
(estimated - measured) / measured for every column, TorchCAP's too (their page divides by the estimate; the
printed figure is kept in the JSON as ``torchcap_error_printed_pct``). Nothing here is fitted: the estimates use
the shipped specs and calibration files only.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .references import load_reference
from .tables import Column, render_csv, render_markdown, render_rst_grid, rst_heading

NA = "n/a"
GIB = 2**30
TORCHCAP_TOKENS = 16 * 1024
# TorchCAP's measured numbers are profiler kernel sums of one fp16 pass with the loss (seeds/README.md)
TORCHCAP_RUNTIME = "kernel-sum"
TORCHCAP_BOARD_POWER_W = {"rtx-a5000": 230.0, "rtx-a6000": 300.0}
CS336_DEVICES = ("h100-sxm", "a100-sxm4-80gb", "h100-pcie")
CS336_STEADY_WARMUP = (1, 5)


@dataclass
class Row:
    label: list[str]
    values: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _err(est: float | None, meas: float | None) -> float | None:
    if est is None or meas in (None, 0):
        return None
    return (est - meas) / meas


def _f(x: float | None, digits: int = 2) -> str:
    if x is None:
        return NA
    return f"{x:,.{digits}f}" if abs(x) >= 0.1 or x == 0 else f"{x:.4f}"


def _pct(e: float | None) -> str:
    return NA if e is None else f"{100 * e:+.2f}%"


def _stats(errors: Sequence[float | None]) -> tuple[int, float | None, float | None]:
    present = [abs(e) for e in errors if e is not None]
    if not present:
        return 0, None, None
    return len(present), 100 * statistics.fmean(present), 100 * max(present)


# ------------------------------------------------------------------ TorchCAP

def _harness_profile(name: str) -> dict:
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(__file__).parent / "harness_profiles" / f"{name}.yaml").read_text())


def loss_tail_bytes_per_element(steps: list[dict], keep: Sequence[int] = ()) -> float:
    """Peak bytes per logits element over a loss tail run with exported liveness: during step i its inputs and its
    output are live; the steps it frees are dropped after it, except those in ``keep`` (graph outputs).
    (opt: 2 + 2 = 4; llama: 4 + 4 = 8; llama keeping the fp16 logits: 2 + 4 + 4 = 10)."""
    live: set[int] = set()
    peak = 0.0
    for i, step in enumerate(steps):
        live.add(i)
        peak = max(peak, sum(steps[j]["out_bytes"] for j in live))
        live -= set(step.get("frees", [])) - set(keep)
    return peak


def _profile_path(config: dict) -> dict | None:
    return _harness_profile("torchcap")["single_gpu"]["loss_paths"].get(config.get("model_type"))


def torchcap_memory_bytes(estimate, config: dict, batch: int, seq: int, gpus: int) -> float | None:
    """TorchCAP's harness (harness_profiles/torchcap.yaml): weights (sharded as the estimate holds them) + workspace +
    the loss tail's peak over batch x seq x vocab logits, as an exported no_grad module holds them; on 8 GPUs the
    logits are a graph output (multi_gpu.keep). None for a model type the profile does not describe."""
    path = _profile_path(config)
    if path is None:
        return None
    keep = _harness_profile("torchcap")["multi_gpu"]["keep"] if gpus > 1 else ()
    tail = loss_tail_bytes_per_element(path["steps"], keep) * batch * seq * config["vocab_size"]
    return (estimate.memory.weights_gb + estimate.memory.workspace_gb) * 1e9 + tail


def torchcap_single_gpu_memory_bytes(estimate, model: str, batch: int, seq: int) -> float | None:
    from aisim.catalog import resolve_model

    return torchcap_memory_bytes(estimate, resolve_model(model)[1], batch, seq, 1)


def _memory_kernel_s(nbytes: float, gpu, cal) -> float:
    """One memory-bound kernel moving ``nbytes`` (read + written), on the device calibration's memory curve."""
    from aisim.cost import efficiency

    return nbytes / gpu.memory_bw_bytes_per_s / efficiency.memory_efficiency(cal, nbytes, gpu)


def _attention_call_s(flops: float, nbytes: float, gpu, cal, dtype: str) -> float:
    from aisim.cost import efficiency

    roofline = max(flops / gpu.peak_for(dtype), nbytes / gpu.memory_bw_bytes_per_s)
    return roofline / efficiency.attention_efficiency(cal, dtype, "", flops, nbytes, gpu)


def torchcap_runtime_correction_ms(config: dict, device: str, batch: int, seq: int, dtype: str) -> dict[str, float]:
    """What TorchCAP's exported transformers-4.48.2 pass runs that aisim's eager transformers-5.17 trace does not
    (harness_profiles/torchcap.yaml), per part in ms, costed with the device's calibration:

    - attention: the materialised causal mask sends SDPA to its masked kernel over all seq x seq pairs, where the
      trace charges flash attention over the causal half (seq (seq + 1) / 2 pairs): the difference per layer;
    - repeat_kv: K and V expanded to the query heads, two copies per layer where the model has fewer KV heads;
    - loss: the harness's loss kernels (loss_paths) minus the ones the trace has (aisim_trace_loss)."""
    from aisim.catalog import resolve_device
    from aisim.specs import calibration_for

    prof = _harness_profile("torchcap")
    gpu = resolve_device(device).gpu
    cal = calibration_for(gpu.name, gpu.architecture)
    esize = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    out: dict[str, float] = {}
    att = prof["exported_attention"]
    if att["mask"] == "explicit":
        qkvo = batch * seq * head_dim * esize * (2 * heads + 2 * kv_heads)       # q, out + k, v
        causal = 4.0 * batch * heads * head_dim * seq * (seq + 1) / 2
        full = 4.0 * batch * heads * head_dim * seq * seq
        mask = batch * seq * seq * esize
        out["attention"] = layers * (_attention_call_s(full, qkvo + mask, gpu, cal, dtype)
                                     - _attention_call_s(causal, qkvo, gpu, cal, dtype)) * 1e3
    if att["repeat_kv"] and kv_heads < heads:
        copy = batch * seq * head_dim * esize * (kv_heads + heads)              # read the KV heads, write all heads
        out["repeat_kv"] = 2 * layers * _memory_kernel_s(copy, gpu, cal) * 1e3
    path = _profile_path(config)
    if path is not None:
        elements = batch * seq * config["vocab_size"]

        def tail_s(steps):
            return sum(_memory_kernel_s((st["in_bytes"] + st["out_bytes"]) * elements, gpu, cal)
                       for st in steps if not st.get("gemm"))
        out["loss"] = (tail_s(path["steps"]) - tail_s(prof["single_gpu"]["aisim_trace_loss"]["steps"])) * 1e3
    return out


def torchcap_revision(model: str, gpus: int) -> dict | None:
    """The multi-GPU harness revision that produced a row (harness_profiles/torchcap.yaml multi_gpu.revisions)."""
    if gpus == 1:
        return None
    short = model.split("/")[-1]
    return next((rv for rv in _harness_profile("torchcap")["multi_gpu"]["revisions"] if short in rv["rows"]), None)


def torchcap_rows(estimator: Callable) -> list[Row]:
    from aisim.catalog import resolve_model

    ref = load_reference("torchcap")
    rows = []
    latest = {(r["aisim_model"], r["device"]) for r in ref["rows"]}
    extra = [r for r in ref["rows_004"] if r.get("measured") is None and (r["aisim_model"], r["device"]) not in latest]
    for r in ref["rows"] + extra:
        kwargs = dict(model=r["aisim_model"], device=r["device"], workload="forward", batch=r["batch"], seq=r["seq"],
                      dtype=r["dtype"], with_loss=True, runtime=TORCHCAP_RUNTIME)
        if r["gpus"] > 1:
            kwargs.update(tp=r["gpus"], tp_scope="mlp")
        e = estimator(**kwargs)
        meas = r.get("measured") or {}
        theirs = r.get("torchcap_estimated") or {}
        gpu = "rtx-a5000" if "a5000" in r["device"] else "rtx-a6000"
        config = resolve_model(r["aisim_model"])[1]
        revision = torchcap_revision(r["aisim_model"], r["gpus"])
        modelled = revision is None or revision["modelled"]
        correction = torchcap_runtime_correction_ms(config, r["device"], r["batch"], r["seq"], r["dtype"]) \
            if modelled and e.runtime_ms is not None else {}
        runtime = e.runtime_ms + sum(correction.values()) if e.runtime_ms is not None else None
        memory_bytes = (torchcap_memory_bytes(e, config, r["batch"], r["seq"], r["gpus"]) if modelled else None) \
            or e.memory_gb * 1e9
        throughput = TORCHCAP_TOKENS / (runtime / 1e3) if runtime else None
        row = Row(label=[r["model"], r["device_as_printed"]])
        row.values = {"runtime_measured": meas.get("runtime_ms"), "runtime_torchcap": theirs.get("runtime_ms"),
                      "runtime_aisim": runtime, "memory_measured": meas.get("memory_gb"),
                      "memory_torchcap": theirs.get("memory_gb"), "memory_aisim": memory_bytes / GIB,
                      "energy_torchcap_style": (meas["runtime_ms"] / 1e3 * TORCHCAP_BOARD_POWER_W[gpu] /
                                                TORCHCAP_TOKENS) if meas.get("runtime_ms") else None,
                      "energy_aisim": e.energy_j_per_token,
                      "throughput_measured": TORCHCAP_TOKENS / (meas["runtime_ms"] / 1e3) if meas.get("runtime_ms")
                      else None, "throughput_aisim": throughput}
        row.errors = {"runtime_torchcap": _err(theirs.get("runtime_ms"), meas.get("runtime_ms")),
                      "runtime_aisim": _err(runtime, meas.get("runtime_ms")),
                      "memory_torchcap": _err(theirs.get("memory_gb"), meas.get("memory_gb")),
                      "memory_aisim": _err(row.values["memory_aisim"], meas.get("memory_gb")),
                      "throughput_aisim": _err(throughput, row.values["throughput_measured"])}
        row.notes = [f"gpus={r['gpus']}", f"table={r.get('table')}", f"version={r.get('version')}",
                     f"printed_torchcap_error_pct={(r.get('torchcap_error_pct') or {}).get('runtime')}",
                     "harness=" + ("modelled" if modelled else "not-modelled"),
                     "harness_correction_ms=" + ", ".join(f"{k} {v:+.1f}" for k, v in correction.items())]
        if not modelled:
            row.notes.append("older multi-GPU harness (harness_profiles/torchcap.yaml multi_gpu.revisions): "
                             "aisim's MLP-parallel estimate of the LM pass, not a model of what ran")
        if not meas:
            row.notes.append("no measurement in the source (empty row in seed 004): estimate only")
        rows.append(row)
    return rows


TORCHCAP_COLUMNS = [
    Column("Model", align="left"), Column("Device", align="left"),
    Column("Runtime (ms)", ("Measured", "TorchCAP", "Error", "aisim", "Error")),
    Column("Memory (GiB)", ("Measured", "TorchCAP", "Error", "aisim", "Error")),
    Column("Energy (J/token)", ("TorchCAP: runtime x board power", "aisim (power model)")),
    Column("Throughput (token/s)", ("Measured", "aisim", "Error")),
]


def _torchcap_cells(r: Row) -> list[str]:
    v, e = r.values, r.errors
    return [*r.label, _f(v["runtime_measured"]), _f(v["runtime_torchcap"]), _pct(e["runtime_torchcap"]),
            _f(v["runtime_aisim"]), _pct(e["runtime_aisim"]), _f(v["memory_measured"]), _f(v["memory_torchcap"]),
            _pct(e["memory_torchcap"]), _f(v["memory_aisim"]), _pct(e["memory_aisim"]),
            _f(v["energy_torchcap_style"], 4), _f(v["energy_aisim"], 4), _f(v["throughput_measured"], 0),
            _f(v["throughput_aisim"], 0), _pct(e["throughput_aisim"])]


def torchcap_summary(rows: list[Row]) -> list[list[str]]:
    out = []
    modelled = "harness=modelled"
    groups = (("runtime, 1 GPU", "runtime", ("gpus=1",)), ("runtime, 8 GPUs", "runtime", ("gpus=8",)),
              ("runtime, 8 GPUs, harness modelled (clm rows)", "runtime", ("gpus=8", modelled)),
              ("runtime, all rows", "runtime", ()), ("runtime, rows whose harness is modelled", "runtime", (modelled,)),
              ("memory, all rows", "memory", ()), ("memory, rows whose harness is modelled", "memory", (modelled,)))
    for label, metric, tags in groups:
        sel = [r for r in rows if all(t in r.notes for t in tags)]
        for who in ("aisim", "torchcap"):
            n, mape, mx = _stats([r.errors[f"{metric}_{who}"] for r in sel])
            out.append([label, "aisim" if who == "aisim" else "TorchCAP", str(n), _pct_abs(mape), _pct_abs(mx)])
    return out


def _pct_abs(v: float | None) -> str:
    return NA if v is None else f"{v:.2f}%"


# ------------------------------------------------------------------ CS336

def cs336_rows(estimator: Callable, devices: Sequence[str] = CS336_DEVICES) -> list[Row]:
    ref = load_reference("cs336")
    rows = []
    cache: dict[tuple, float | None] = {}
    for r in ref["rows"]:
        workload = "forward" if r["pass"] == "forward" else "forward-backward"
        row = Row(label=[r["size"], str(r["context"]), r["pass"].replace("_", "+"), str(r["warmup_steps"])])
        row.values["measured"] = r["mean_ms"]
        row.values["std"] = r["std_ms"]
        for dev in devices:
            key = (r["aisim_model"], dev, workload, r["context"])
            if key not in cache:
                cache[key] = estimator(model=r["aisim_model"], device=dev, workload=workload, batch=r["batch"],
                                       seq=r["context"], dtype="fp32").runtime_ms
            row.values[dev] = cache[key]
            row.errors[dev] = _err(cache[key], r["mean_ms"])
        row.notes = [f"warmup={r['warmup_steps']}"]
        rows.append(row)
    return rows


def cs336_summary(rows: list[Row], devices: Sequence[str]) -> list[list[str]]:
    out = []
    for label, warmups in (("steady state (1 and 5 warm-up steps)", CS336_STEADY_WARMUP),
                           ("no warm-up (harness effect: first-call overhead, not the model)", (0,))):
        sel = [r for r in rows if int(r.label[3]) in warmups]
        for dev in devices:
            n, mape, mx = _stats([r.errors[dev] for r in sel])
            bias = statistics.fmean([r.errors[dev] for r in sel if r.errors[dev] is not None]) if n else None
            out.append([label, dev, str(n), _pct_abs(mape), _pct_abs(mx), _pct(bias)])
    return out


# ------------------------------------------------------------------ TGI (bloomz-7b1-mt)

TGI_DEVICES = ("a100-sxm4-80gb", "a100-sxm4-40gb", "a100-pcie-80gb", "h100-sxm")
TGI_RUNTIME = "tgi-2023"
TGI_MODEL = "bloomz-7b1-mt"


def tgi_rows(bench: Callable, devices: Sequence[str] = TGI_DEVICES) -> list[Row]:
    """Every seed row (shards x quant x sequence length x batch), estimated on each plausible device."""
    ref = load_reference("tgi-bloomz")
    rows = []
    for run in ref["runs"]:
        quant = run.get("quant") or "none"
        batches = [b["batch_size"] for b in run["batches"]]
        results = {dev: {r.batch: r for r in bench(model=TGI_MODEL, device=dev, shards=[run["shards"]],
                                                   batches=batches, seq=run["sequence_length"],
                                                   decode_len=run["decode_length"], quant=quant,
                                                   runtime=TGI_RUNTIME).shards[0].rows}
                   for dev in devices}
        for b in run["batches"]:
            meas_prefill = (b.get("prefill_latency_ms") or {}).get("avg")
            meas_decode = (b.get("decode_token_latency_ms") or {}).get("avg")
            row = Row(label=[str(run["shards"]), quant, str(run["sequence_length"]), str(b["batch_size"]),
                             b.get("status", "ok")])
            row.values = {"prefill_measured": meas_prefill, "decode_measured": meas_decode}
            for dev in devices:
                est = results[dev][b["batch_size"]]
                row.values[f"{dev}_prefill"] = est.prefill_ms
                row.values[f"{dev}_decode"] = est.decode_token_ms
                row.values[f"{dev}_fits"] = est.fits
                row.errors[f"{dev}_prefill"] = _err(est.prefill_ms, meas_prefill)
                row.errors[f"{dev}_decode"] = _err(est.decode_token_ms, meas_decode)
            rows.append(row)
    return rows


def _tgi_cell(r: Row, dev: str, metric: str) -> list[str]:
    if not r.values[f"{dev}_fits"]:
        return ["does not fit", NA]
    return [_f(r.values[f"{dev}_{metric}"]), _pct(r.errors[f"{dev}_{metric}"])]


def tgi_best_fit(rows: list[Row], devices: Sequence[str]) -> str:
    """Which candidate device fits the measured rows best: the mean of its prefill and decode MAPEs (all rows)."""
    scores = {}
    for dev in devices:
        mapes = [_stats([r.errors[f"{dev}_{m}"] for r in rows])[1] for m in ("prefill", "decode")]
        if None not in mapes:
            scores[dev] = sum(mapes) / 2
    ranked = sorted(scores, key=scores.get)
    return ("Best fit (mean of the prefill and decode MAPE over all measured rows, fp16 and int8): " +
            ", ".join(f"{d} {scores[d]:.1f}%" for d in ranked) + ".")


def tgi_summary(rows: list[Row], devices: Sequence[str]) -> list[list[str]]:
    out = []
    for dev in devices:
        for label, quant in (("fp16 rows", "none"), ("bitsandbytes-int8 rows", "bitsandbytes-int8")):
            sel = [r for r in rows if r.label[1] == quant]
            for metric in ("prefill", "decode"):
                n, mape, mx = _stats([r.errors[f"{dev}_{metric}"] for r in sel])
                out.append([dev, label, f"{metric} latency", str(n), _pct_abs(mape), _pct_abs(mx)])
    return out


# ------------------------------------------------------------------ whisper.cpp (medium.en, GTX 1650 laptop)

WHISPER_MODEL, WHISPER_DEVICE, WHISPER_BEAM = "whisper-medium.en", "gtx-1650-mobile", 5
WHISPER_PHASES = ("encode", "decode", "batchd", "prompt")
WHISPER_RUNTIMES = {"vulkan": "ggml-vulkan", "cuda": "ggml-cuda"}
WHISPER_POWER_MODES = {"performance": "performance", "balanced": "balanced", "power_saver": "power-saver"}


def _whisper_counts(row: dict, n_text_ctx: int):
    from aisim.studies.transcribe import TranscriptCounts

    ph = row["phases"]
    return TranscriptCounts.from_runs(ph["encode"]["runs"], ph["decode"]["runs"], ph["batchd"]["runs"],
                                      ph["prompt"]["runs"], row["tokens"], WHISPER_BEAM, n_text_ctx)


def whisper_rows(transcriber: Callable) -> list[Row]:
    """Every block of the seed: recorded ones compared per phase (time per run, as whisper.cpp prints it) and in
    GPU tokens per second; the never-recorded Power Saver blocks estimated with the same backend and recording's
    Performance run counts under the GPU spec's power-saver mode."""
    from aisim.catalog import resolve_model

    ref = load_reference("whisper-cpp")
    n_text_ctx = resolve_model(WHISPER_MODEL)[1]["max_target_positions"]
    recorded = {(r["backend"], r["recording"]): r for r in ref["rows"]
                if r["status"] == "ok" and r["power_mode"] == "performance"}
    rows = []
    for r in ref["rows"]:
        source = r if r["status"] == "ok" else recorded[(r["backend"], r["recording"])]
        est = transcriber(WHISPER_MODEL, WHISPER_DEVICE, _whisper_counts(source, n_text_ctx),
                          runtime=WHISPER_RUNTIMES[r["backend"]], power_mode=WHISPER_POWER_MODES[r["power_mode"]])
        if not est.fits:
            raise ValueError(f"{WHISPER_MODEL} does not fit {WHISPER_DEVICE}: {est.not_fit_reason}")
        lines = {p.name: p for p in est.speech}
        row = Row(label=[r["backend"], r["recording"], r["power_mode"], r["status"]])
        gpu_ms = 0.0
        for phase in WHISPER_PHASES:
            meas = r["phases"][phase]["per_run_ms"] if r["status"] == "ok" else None
            row.values[f"{phase}_measured"] = meas
            row.values[f"{phase}_estimate"] = lines[phase].per_run_ms
            row.errors[phase] = _err(lines[phase].per_run_ms, meas)
            if r["status"] == "ok":
                gpu_ms += r["phases"][phase]["total_ms"]
        meas_tps = r["tokens"] / (gpu_ms / 1e3) if r["status"] == "ok" else None
        row.values["tps_measured"] = meas_tps
        row.values["tps_estimate"] = est.throughput_tokens_per_s
        row.values["power_w_estimate"] = est.power_w
        row.errors["tps"] = _err(est.throughput_tokens_per_s, meas_tps)
        if r["status"] != "ok":
            row.notes = [f"counts of the {source['heading_as_printed']} block"]
        rows.append(row)
    return rows


def whisper_summary(rows: list[Row]) -> list[list[str]]:
    out = []
    for backend in ("vulkan", "cuda", None):
        sel = [r for r in rows if r.label[3] == "ok" and (backend is None or r.label[0] == backend)]
        for metric in (*WHISPER_PHASES, "tps"):
            n, mape, mx = _stats([r.errors[metric] for r in sel])
            errs = [r.errors[metric] for r in sel if r.errors[metric] is not None]
            bias = statistics.fmean(errs) if errs else None
            label = "GPU tokens/s" if metric == "tps" else f"{metric} per run"
            out.append([backend or "both", label, str(n), _pct_abs(mape), _pct_abs(mx), _pct(bias)])
    return out


# ------------------------------------------------------------------ TensorRT-LLM's published tables

TRTLLM_DEVICES = {"h100": "h100-sxm", "a100": "a100-sxm4-80gb", "l40s": "l40s"}
TRTLLM_MODELS = {"llama-7b": "Llama-2-7b-hf", "llama-70b": "Llama-2-70b-hf"}
# TensorRT-LLM is not profiled on its own: vllm is aisim's engine profile with the same kind of kernels (fused
# norms and activations, flash attention, a KV cache written in place, vocabulary-parallel head)
TRTLLM_RUNTIME = "vllm"
TRTLLM_CALIBRATED = {"h100"}
TRTLLM_FOOTER = (
    "Where the rows part: (1) Llama-2-70B with long outputs runs slower than its weights and KV cache at the HBM "
    "bandwidth allow: v0.6.1 had no XQA kernel, and its generation attention for grouped-query models was the "
    "masked multi-head kernel (TensorRT-LLM README, 2024/01/30: \"New XQA-kernel provides 2.4x more Llama-70B "
    "throughput within the same latency budget\"; v0.10.0 release notes: \"Integrated the new NVIDIA Hopper XQA "
    "kernels for LLaMA 2 70B\"). aisim prices attention as vllm's kernels read the cache, once per KV head. "
    "(2) First-token latency of a 128-token prompt is whole milliseconds in the source and holds gptSession's "
    "per-call work without CUDA graphs (every layer's launches, buffer set-up, the output copy); aisim's vllm "
    "profile is a serving engine's step. Neither is modelled as a TensorRT-LLM profile: these rows are evidence "
    "for the GPU rules, not a fit.")


def _trtllm_device(r: dict) -> str:
    name = TRTLLM_DEVICES[r["gpu"]]
    return name if r["tp"] == 1 else f"{name}x{r['tp']}"


def _trtllm_runtime():
    """vllm's kernels without vLLM's memory policy: gptSession allocates the static batch's whole KV cache
    (max_batch_size x max sequence), no gpu_memory_utilization pool."""
    from aisim.specs import all_runtimes

    return all_runtimes()[TRTLLM_RUNTIME].model_copy(update={"serving": None})


def _trtllm_kwargs(r: dict, runtime) -> dict:
    """One row as aisim arguments: FP8 engines (weights, activations and KV cache in FP8) as --quant fp8
    --kv-dtype fp8, FP16 ones as fp16."""
    quant = dict(quant="fp8", kv_dtype="fp8") if r["precision"] == "fp8" else {}
    return dict(model=TRTLLM_MODELS[r["model"]], device=_trtllm_device(r), batch=r["batch"], seq=r["input_len"],
                dtype="fp16", tp=r["tp"], runtime=runtime, top_ops=None, **quant)


def trtllm_rows(estimator: Callable) -> tuple[list[Row], list[Row]]:
    """Peak-throughput rows (a static batch: one prefill of every prompt, then output_len - 1 decode steps, as
    gptSessionBenchmark times session.generate; out tok/s per GPU) and first-token-latency rows (a prefill)."""
    ref = load_reference("trtllm-perf")
    runtime = _trtllm_runtime()     # one object for every row: the scenario's spec hash is memoised per object
    throughput = []
    for r in ref["throughput_rows"]:
        e = estimator(workload="generate", gen=r["output_len"], **_trtllm_kwargs(r, runtime))
        total = r["batch"] * r["output_len"] / (e.runtime_ms / 1e3) if e.runtime_ms else None
        per_gpu = total / r["tp"] if total else None
        row = Row(label=[r["gpu"], r["model"], r["precision"], str(r["batch"]), str(r["tp"]), str(r["input_len"]),
                         str(r["output_len"]), r["version"]])
        row.values = {"measured": r["out_tok_s"], "aisim": per_gpu, "fits": e.fits}
        row.errors = {"aisim": _err(per_gpu, r["out_tok_s"])}
        if r["tp"] > 1 and not r["per_gpu"]:   # the header does not say per GPU: the total reading beside it
            row.errors["if_total"] = _err(total, r["out_tok_s"])
        row.notes = ["calibrated" if r["gpu"] in TRTLLM_CALIBRATED else "default rules", f"tp={r['tp']}"]
        throughput.append(row)
    latency = []
    for r in ref["latency_rows"]:
        e = estimator(workload="prefill", **_trtllm_kwargs(r, runtime))
        row = Row(label=[r["gpu"], r["model"], r["precision"], str(r["batch"]), str(r["tp"]), str(r["input_len"]),
                         r["version"]])
        row.values = {"measured": r["first_token_ms"], "aisim": e.runtime_ms, "fits": e.fits}
        row.errors = {"aisim": _err(e.runtime_ms, r["first_token_ms"])}
        row.notes = ["calibrated" if r["gpu"] in TRTLLM_CALIBRATED else "default rules", f"input={r['input_len']}"]
        latency.append(row)
    return throughput, latency


def trtllm_summary(throughput: list[Row], latency: list[Row]) -> list[list[str]]:
    out = []

    def add(label: str, sel: list[Row]) -> None:
        errs = [r.errors["aisim"] for r in sel]
        n, mape, mx = _stats(errs)
        present = [e for e in errs if e is not None]
        out.append([label, str(n), _pct_abs(mape), _pct_abs(mx), _pct(statistics.fmean(present) if present else None)])

    one = [r for r in throughput if "tp=1" in r.notes]
    for gpu in ("h100", "a100", "l40s"):
        sel = [r for r in one if r.label[0] == gpu]
        add(f"out tok/s, one GPU, {gpu} ({sel[0].notes[0]})", sel)
    add("out tok/s, one GPU, a100 and l40s (never measured by aisim)",
        [r for r in one if r.notes[0] == "default rules"])
    add("out tok/s, tensor parallel, Llama-2-7B (a100, per GPU)",
        [r for r in throughput if "tp=1" not in r.notes and r.label[1] == "llama-7b"])
    for out_len, what in (("128", "output 128"), ("2048", "output 2048: grouped-query decode before XQA")):
        add(f"out tok/s, tensor parallel, Llama-2-70B, {what} (per GPU)",
            [r for r in throughput if r.label[1] == "llama-70b" and r.label[6] == out_len])
    add("first-token latency, input 2048", [r for r in latency if "input=2048" in r.notes])
    add("first-token latency, input 128", [r for r in latency if "input=128" in r.notes])
    return out


VLLM_SERVE_DEVICES = {"a100": "a100-sxm4-80gb", "h100": "h100-sxm"}
VLLM_SERVE_MODEL = "gpt-oss-20b"
VLLM_SERVE_METRICS = (("total_tok_s", "total_token_throughput", "total tok/s"),
                      ("mean_ttft_ms", "mean_ttft_ms", "mean TTFT (ms)"),
                      ("mean_tpot_ms", "mean_tpot_ms", "mean TPOT (ms)"))


def vllm_serve_args(r: dict) -> dict:
    """One published run as `aisim serve` arguments: its requests all at once (rate inf), each with the run's mean
    input and generated tokens (Total input / generated tokens over the requests: the runs stop at the model's end
    of sequence, so the generated tokens are the measured ones, not --random-output-len)."""
    return dict(model=VLLM_SERVE_MODEL, device=VLLM_SERVE_DEVICES[r["gpu"]], num_requests=r["requests"],
                input_len=str(round(r["input_tokens"] / r["requests"])),
                output_len=str(max(round(r["generated_tokens"] / r["requests"]), 1)))


def vllm_serve_rows(serve: Callable | None = None) -> list[Row]:
    """Each published vLLM bench-serve run against `aisim serve --runtime vllm` of the same requests: total token
    throughput, mean TTFT and mean TPOT (``serve``: kwargs of vllm_serve_args -> a report with vLLM-named
    ``metrics``; default aisim's, cli_run.ServeReport)."""
    serve = serve or _aisim_serve
    rows = []
    for r in load_reference("vllm-serve")["rows"]:
        args = vllm_serve_args(r)
        result = serve(**args)
        row = Row(label=[r["gpu"], r["case"], str(r["requests"]), args["input_len"], args["output_len"]])
        row.values = {"measured": {k: r[k] for k, _, _ in VLLM_SERVE_METRICS},
                      "aisim": {k: result.metrics[attr] for k, attr, _ in VLLM_SERVE_METRICS}}
        row.errors = {k: _err(row.values["aisim"][k], r[k]) for k, _, _ in VLLM_SERVE_METRICS}
        row.notes = ["calibrated" if r["gpu"] in TRTLLM_CALIBRATED else "default rules"]
        rows.append(row)
    return rows


def _aisim_serve(**args):
    from aisim.studies.serve.cli_run import run_serve

    result, _, _ = run_serve(dtype="auto", tp=None, pp=1, quant="none", runtime="vllm", calibration="auto",
                             rate=float("inf"), arrival="poisson", seed=0, trace=None, replicas=None,
                             router="round-robin", percentiles="99", knobs={}, **args)
    return result


def vllm_serve_summary(rows: list[Row]) -> list[list[str]]:
    out = []
    for gpu in VLLM_SERVE_DEVICES:
        sel = [r for r in rows if r.label[0] == gpu]
        for key, _, what in VLLM_SERVE_METRICS:
            errs = [r.errors[key] for r in sel]
            n, mape, mx = _stats(errs)
            present = [e for e in errs if e is not None]
            out.append([f"{what}, {VLLM_SERVE_DEVICES[gpu]} ({sel[0].notes[0]})", str(n), _pct_abs(mape),
                        _pct_abs(mx), _pct(statistics.fmean(present) if present else None)])
    return out


# ------------------------------------------------------------------ rendering

def _summary_record(columns, row, pct: set[int]) -> dict:
    """A summary table row as a JSON record: snake_case column names; counts as ints, the percentage columns
    (``pct``: their indices) as floats in a ``_pct`` key in every row, other text as is; 'n/a' as null."""
    out: dict = {}
    for i, (column, cell) in enumerate(zip(columns, row)):
        key = re.sub(r"[^a-z0-9]+", "_", column.title.lower()).strip("_")
        text = str(cell).strip()
        if i in pct:
            try:
                out[f"{key}_pct"] = float(text.rstrip("%").replace(",", ""))
            except ValueError:
                out[f"{key}_pct"] = None
        elif key == "n" and text.isdigit():
            out[key] = int(text)
        else:
            out[key] = None if text == "n/a" else text
    return out


def _render(fmt: str, title: str, note: str, columns, cells, summary_columns, summary_cells, payload,
            footer: str = "", body: str | None = None) -> str:
    """``body``: the rows already rendered (a reference with more than one table); else ``columns`` x ``cells``."""
    if fmt == "json":   # summary rows keyed by their column, figures as numbers (MAPE "5.41%" -> mape_pct 5.41)
        pct = {i for i in range(len(summary_columns)) if any(str(r[i]).strip().endswith("%") for r in summary_cells)}
        return json.dumps({**payload, "summary": [_summary_record(summary_columns, row, pct) for row in summary_cells]},
                          indent=1)
    if fmt == "csv":
        return render_csv(columns, cells)
    if fmt not in ("rst", "markdown"):
        raise ValueError(f"format {fmt!r}: use rst, markdown, csv or json")
    render = render_rst_grid if fmt == "rst" else render_markdown
    head = rst_heading(title, "=") if fmt == "rst" else f"# {title}"
    summary_head = rst_heading("Summary", "-") if fmt == "rst" else "## Summary"
    return "\n\n".join([head, note, body if body is not None else render(columns, cells), summary_head,
                        render(summary_columns, summary_cells)] + ([footer] if footer else [])) + "\n"


def compare_reference(name: str, fmt: str = "rst", estimator: Callable | None = None) -> str:
    if estimator is None:
        from aisim import estimate as estimator
    if name == "torchcap":
        rows = torchcap_rows(estimator)
        note = ("TorchCAP benchmark (seeds 001 and 004), fp16 forward with loss, 16 x 1024, runtime = sum of CUDA "
                "kernel times (aisim --runtime kernel-sum), x8 = tensor parallel over 8 GPUs of the MLP only "
                "(--tp 8 --tp-scope mlp). Error = (estimate - measured) / measured for both estimators. Memory in "
                "GiB (TorchCAP's formatter divides by 2**30). TorchCAP's energy is runtime x board power, not "
                "metered, so it is shown beside ours, not as an error. The harness is modelled from its source "
                "(validation/harness_profiles/torchcap.yaml): the exported transformers-4.48.2 pass runs masked "
                "attention over all pairs, repeat_kv copies and its own loss kernels (added to the traced step), "
                "and holds the weights plus the loss tail (plus the logits on 8 GPUs). The OPT x 8 rows come from "
                "an older multi-GPU script (base model, auto-sharding plan, 5 passes) that is not modelled: their "
                "aisim figures are the MLP-parallel LM pass, shown but not a model of what ran. RTX A5000 GEMMs "
                "use TorchCAP's published matmul microbenchmark of that GPU (hardware_specs/calibration/"
                "rtx-a5000.yaml); the RTX A6000 uses the documented default rules.")
        sc = [Column("Rows", align="left"), Column("Estimator", align="left"), Column("n"), Column("MAPE"),
              Column("Max abs error")]
        summary = torchcap_summary(rows)
        payload = {"rows": [{"label": r.label, **r.values, "errors": r.errors, "notes": r.notes} for r in rows],
                   "summary": summary}
        return _render(fmt, "TorchCAP table: measured vs TorchCAP vs aisim", note, TORCHCAP_COLUMNS,
                       [_torchcap_cells(r) for r in rows], sc, summary, payload)
    if name == "cs336":
        rows = cs336_rows(estimator)
        note = ("CS336 (spring 2025) assignment 2 benchmark: batch 4, fp32, mean of 10 trials. The GPU is not "
                "named in that section; aisim estimates each plausible device (H100 SXM, A100 SXM4 80GB, H100 "
                "PCIe). The 0-warm-up rows include first-call overhead (CUDA context, cuBLAS handles, allocator "
                "growth): they show the harness effect, not the model, and are summarised apart.")
        columns = [Column("Size", align="left"), Column("Context"), Column("Pass", align="left"),
                   Column("Warm-up"), Column("Measured (ms)", ("mean", "std")),
                   *[Column(f"aisim {d} (ms)", ("estimate", "Error")) for d in CS336_DEVICES]]
        cells = [[*r.label, _f(r.values["measured"]), _f(r.values["std"]),
                  *[c for d in CS336_DEVICES for c in (_f(r.values[d]), _pct(r.errors[d]))]] for r in rows]
        sc = [Column("Rows", align="left"), Column("Device", align="left"), Column("n"), Column("MAPE"),
              Column("Max abs error"), Column("Mean error")]
        summary = cs336_summary(rows, CS336_DEVICES)
        payload = {"rows": [{"label": r.label, **r.values, "errors": r.errors} for r in rows], "summary": summary}
        return _render(fmt, "CS336 benchmark: measured vs aisim", note, columns, cells, sc, summary, payload)
    if name == "tgi-bloomz":
        from aisim.api import serve_bench

        rows = tgi_rows(serve_bench)
        note = ("text-generation-benchmark report of bigscience/bloomz-7b1-mt (TGI v0.7-v0.8, mid 2023), "
                "sequence length 1024 (and 100), decode length 8, 1-8 shards, one bitsandbytes int8 run. The GPU is "
                "not stated: aisim estimates each plausible shipped device (A100 SXM4 80GB and 40GB with NVSwitch, "
                "A100 "
                "PCIe 80GB over PCIe, H100 SXM; the A100s have no calibration file, so the default rules apply) with "
                "--runtime tgi-2023 (TGI 0.x's request loop, prompt logprobs over the full vocabulary and a gRPC "
                "call per step, counted in its source) and, for the int8 run, bitsandbytes LLM.int8's matmul "
                "expanded from its source. Latencies are the averages; the decode latency is per step. Status "
                "'nan_in_source'/'empty_in_source' rows have no measurement; aisim's column says whether it thinks "
                "they fit. aisim traces the transformers BLOOM code; tokenizer CPU time is not modelled.")
        columns = [Column("Shards"), Column("Quant", align="left"), Column("Seq"), Column("Batch"),
                   Column("Status", align="left"), Column("Measured (ms)", ("prefill", "decode/token")),
                   *[Column(f"aisim {d}", ("prefill (ms)", "prefill error", "decode/token (ms)", "decode error"))
                     for d in TGI_DEVICES]]
        cells = [[*r.label, _f(r.values["prefill_measured"]), _f(r.values["decode_measured"]),
                  *[c for d in TGI_DEVICES for c in (_tgi_cell(r, d, "prefill") + _tgi_cell(r, d, "decode"))]]
                 for r in rows]
        sc = [Column("Device", align="left"), Column("Rows", align="left"), Column("Metric", align="left"),
              Column("n"), Column("MAPE"), Column("Max abs error")]
        summary = tgi_summary(rows, TGI_DEVICES)
        best = tgi_best_fit(rows, TGI_DEVICES)
        payload = {"rows": [{"label": r.label, **r.values, "errors": r.errors} for r in rows], "summary": summary,
                   "best_fit": best}
        return _render(fmt, "TGI benchmark (bloomz-7b1-mt): measured vs aisim", note, columns, cells, sc, summary,
                       payload, best)
    if name == "whisper-cpp":
        from aisim.api import estimate_transcript

        rows = whisper_rows(estimate_transcript)
        note = ("whisper.cpp 1.7.5 timing printouts (seed 000): ggml medium.en F16 on a GeForce GTX 1650 laptop GPU, "
                "beam 5, Vulkan (aisim --runtime ggml-vulkan) and CUDA (--runtime ggml-cuda), laptop power modes. "
                "Each row's decoder work (encode runs, decode calls, batchd and prompt tokens, output tokens) is "
                "taken from its printout as the workload; the times are estimated. Per-run times as whisper.cpp "
                "prints them (batchd and prompt per token). GPU tokens/s = tokens / (encode + decode + batchd + "
                "prompt time): mel and sample run on the CPU, outside the GPU model. The Power Saver blocks were "
                "never recorded: estimated with the Performance counts under the gtx-1650-mobile spec's "
                "power-saver mode (assumed 35 W, 1245 MHz). The GTX 1650 has no calibration file (default rules); "
                "the backend efficiencies come from the runtime profiles' documented sources, none from this seed.")
        columns = [Column("Backend", align="left"), Column("Recording", align="left"), Column("Mode", align="left"),
                   Column("Status", align="left"),
                   *[Column(f"{p} ms/run", ("measured", "aisim", "Error")) for p in WHISPER_PHASES],
                   Column("GPU tokens/s", ("measured", "aisim", "Error")), Column("aisim W")]
        cells = [[*r.label, *[c for p in WHISPER_PHASES for c in (_f(r.values[f"{p}_measured"]),
                                                                   _f(r.values[f"{p}_estimate"]), _pct(r.errors[p]))],
                  _f(r.values["tps_measured"]), _f(r.values["tps_estimate"]), _pct(r.errors["tps"]),
                  _f(r.values["power_w_estimate"], 1)] for r in rows]
        sc = [Column("Backend", align="left"), Column("Metric", align="left"), Column("n"), Column("MAPE"),
              Column("Max abs error"), Column("Mean error")]
        summary = whisper_summary(rows)
        payload = {"rows": [{"label": r.label, **r.values, "errors": r.errors, "notes": r.notes} for r in rows],
                   "summary": summary}
        return _render(fmt, "whisper.cpp (medium.en, GTX 1650 laptop): measured vs aisim", note, columns, cells,
                       sc, summary, payload)
    if name == "trtllm-perf":
        throughput, latency = trtllm_rows(estimator)
        note = ("TensorRT-LLM's published performance tables (docs/source/performance.md at 138f96d: peak "
                "throughput of v0.6.1 on H100 FP8 and A100 FP16, v0.5 on L40S FP8; first-token latency at batch 1 "
                "of v0.5), Llama-2-7B and Llama-2-70B. gptSessionBenchmark times one session.generate of a static "
                "batch: the prefill of every prompt, then output length - 1 decode steps; throughput = batch x output "
                "length / that time, per GPU. aisim: `aisim estimate --workload generate --batch B --seq IN --gen "
                "OUT --runtime vllm` (TensorRT-LLM has no profile of its own; vllm has the same kind of kernels; "
                "vLLM's memory policy is not applied: gptSession allocates the static batch's KV cache whole), "
                "FP8 engines as --quant fp8 --kv-dtype fp8. A100 and L40S have no calibration file: default rules "
                "and the datasheet. The A100 table does not say per GPU (the H100's does): its tensor-parallel rows "
                "are read per GPU, the error of the total reading beside them. Nothing is fitted to these rows.")
        tc = [Column("GPU", align="left"), Column("Model", align="left"), Column("Precision", align="left"),
              Column("Batch"), Column("TP"), Column("In"), Column("Out"), Column("Version", align="left"),
              Column("Out tok/s per GPU", ("measured", "aisim", "Error", "Error if total"))]
        tcells = [[*r.label, _f(r.values["measured"], 0), _f(r.values["aisim"], 0), _pct(r.errors["aisim"]),
                   _pct(r.errors["if_total"]) if "if_total" in r.errors else NA] for r in throughput]
        lc = [Column("GPU", align="left"), Column("Model", align="left"), Column("Precision", align="left"),
              Column("Batch"), Column("TP"), Column("In"), Column("Version", align="left"),
              Column("First-token latency (ms)", ("measured", "aisim", "Error"))]
        lcells = [[*r.label, _f(r.values["measured"], 0), _f(r.values["aisim"]), _pct(r.errors["aisim"])]
                  for r in latency]
        sc = [Column("Rows", align="left"), Column("n"), Column("MAPE"), Column("Max abs error"),
              Column("Mean error")]
        summary = trtllm_summary(throughput, latency)
        payload = {"throughput_rows": [{"label": r.label, **r.values, "errors": r.errors, "notes": r.notes}
                                       for r in throughput],
                   "latency_rows": [{"label": r.label, **r.values, "errors": r.errors, "notes": r.notes}
                                    for r in latency]}
        if fmt in ("markdown", "rst"):   # two tables: throughput, then first-token latency
            render = render_rst_grid if fmt == "rst" else render_markdown
            tcells_text = render(tc, tcells) + "\n\n" + render(lc, lcells)
            return _render(fmt, "TensorRT-LLM published tables: measured vs aisim", note, [], [], sc, summary,
                           payload, footer=TRTLLM_FOOTER, body=tcells_text)
        if fmt == "csv":   # one table (a Metric column) so the file parses as CSV
            cc = [*tc[:8], Column("Metric", align="left"),
                  *[Column(label) for label in ("measured", "aisim", "Error", "Error if total")]]
            metric = ("out tok/s per GPU", "first-token latency (ms)")
            ccells = [[*row[:8], metric[0], *row[8:]] for row in tcells] + [
                [*row[:6], "", row[6], metric[1], *row[7:], NA] for row in lcells]
            return render_csv(cc, ccells)
        return _render(fmt, "TensorRT-LLM published tables: measured vs aisim", note, tc, tcells, sc, summary,
                       payload)
    if name == "vllm-serve":
        rows = vllm_serve_rows()
        note = ("vLLM v0.11.0 serving gpt-oss-20b (MXFP4 experts) on one A100 SXM 80GB and one H100, `vllm bench "
                "serve` with every request sent at once, as GPUStack's performance lab publishes it (gpustack/"
                "gpustack docs/performance-lab/gpt-oss-20b/a100.md and h100.md; the 'vLLM without any "
                "optimizations' baseline). aisim: `aisim serve -m gpt-oss-20b -d DEVICE --runtime vllm "
                "--num-requests N --input-len IN --output-len OUT` (rate inf; IN and OUT the run's mean input and "
                "generated tokens: the runs stop at end of sequence, and ShareGPT's lengths vary per request where "
                "aisim's are the means). The A100 has no calibration file: default rules and the datasheet. "
                "Nothing is fitted to these rows.")
        columns = [Column("GPU", align="left"), Column("Case", align="left"), Column("Requests"), Column("In"),
                   Column("Out"), *[Column(what, ("measured", "aisim", "Error")) for _, _, what in VLLM_SERVE_METRICS]]
        cells = [[*r.label, *[c for key, _, _ in VLLM_SERVE_METRICS for c in (
            _f(r.values["measured"][key]), _f(r.values["aisim"][key]), _pct(r.errors[key]))]] for r in rows]
        sc = [Column("Rows", align="left"), Column("n"), Column("MAPE"), Column("Max abs error"),
              Column("Mean error")]
        summary = vllm_serve_summary(rows)
        payload = {"rows": [{"label": r.label, **r.values, "errors": r.errors, "notes": r.notes} for r in rows]}
        return _render(fmt, "vLLM serving (GPUStack performance lab, gpt-oss-20b): measured vs aisim", note, columns,
                       cells, sc, summary, payload)
    raise ValueError(f"unknown reference {name!r}; available: torchcap, cs336, tgi-bloomz, whisper-cpp, serve-cb, "
                     "trtllm-perf, vllm-serve")
