"""Rendering only: rich tables for estimates, op tables and lists. No modelling happens here."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .results import Estimate
from .studies.common import reserve_text

console = Console(width=None if Console().is_terminal else 160)  # piped output: wide enough for the tables


def _fmt(value, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1e9 or (value and abs(value) < 10 ** -digits):
        return f"{value:.3e}{unit}"
    if abs(value) >= 1e4:
        return f"{value:,.0f}{unit}"
    return f"{value:,.{digits}f}{unit}"


def print_estimate(e: Estimate, notes: list[str] | None = None) -> None:
    w, p = e.workload, e.plan
    if w.phase == "transcribe":
        audio = f"{w.audio_s:g} s of audio" if w.audio_s else "a given transcript"
        shape = f"{audio}, beam {w.beam}"
    else:
        shape = f"batch {w.batch} x seq {w.seq}"
    quant = f" ({w.quant} weights)" if w.quant != "none" else ""
    title = (f"{e.model} on {e.device}: {w.phase} {shape} {w.dtype}{quant}, "
             f"tp {p.tp} pp {p.pp} dp {p.dp}" + (f" ep {p.ep}" if p.ep > 1 else "")
             + (f" (tp scope {p.tp_scope})" if p.tp > 1 else "") + f", runtime {e.runtime}")
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    unit = "windows" if e.workload.phase == "encode" else "tokens"    # an encoder step counts 30 s audio windows
    rows = [("runtime (ms)", _fmt(e.runtime_ms)), ("peak memory per GPU (GB)", _fmt(e.memory_gb)),
            ("  weights / activations / KV cache", f"{e.memory.weights_gb:.2f} / {e.memory.activations_gb:.2f} / "
             f"{e.memory.kv_cache_gb:.2f}"),
            ("  gradients / optimizer / workspace", f"{e.memory.gradients_gb:.2f} / {e.memory.optimizer_gb:.2f} / "
             f"{e.memory.workspace_gb:.2f}"),
            ("  capacity per GPU (GB)", _fmt(e.memory.capacity_gb)),
            *([("  usable (capacity less " + reserve_text(e.memory) + ")", _fmt(e.memory.usable_gb))]
              if e.memory.runtime_reserved_gb else []),
            ("fits", "yes" if e.fits else "[bold red]DOES NOT FIT[/]"),
            ("energy (J)", _fmt(e.energy_j)), (f"energy (J/{unit[:-1]})", _fmt(e.energy_j_per_token, 5)),
            ("average power per GPU (W)", _fmt(e.power_w, 0)),
            (f"throughput ({unit}/s)", _fmt(e.throughput_tokens_per_s, 1)), (unit, str(e.tokens)),
            ("FLOPs per GPU", f"{e.flops:.3e}"), ("bytes moved per GPU", f"{e.bytes:.3e}")]
    if e.gpu_busy_ms is not None and e.host_busy_ms is not None:
        paced = "GPU" if e.gpu_busy_ms >= e.host_busy_ms else "host"
        stage = ", per pipeline stage" if e.plan.pp > 1 else ""
        rows[1:1] = [(f"  GPU busy / host busy (ms){stage}, {paced}-bound",
                      f"{e.gpu_busy_ms:.2f} / {e.host_busy_ms:.2f}")]
    if e.ttft_ms is not None:
        rows[1:1] = [("  time to first token (ms)", _fmt(e.ttft_ms)), ("  time per output token (ms)", _fmt(e.tpot_ms))]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if e.not_fit_reason:
        console.print(f"[bold red]{e.not_fit_reason}[/]")
    if e.speech:
        console.print(_speech_table(e))
    if e.top_ops and e.fits:
        console.print(_ops_table(e, "top ops by GPU time (% of the step's wall time; the rest is CPU-bound "
                                    "dispatch or overlap)"))
    _notes(e, notes)


def _speech_table(e: Estimate) -> Table:
    """whisper.cpp's timing lines (runs of batchd and prompt are tokens, as whisper.cpp counts them)."""
    table = Table(title="transcription in whisper.cpp's phases (estimated GPU time)", header_style="bold")
    for col in ("phase", "time (ms)", "runs", "ms per run"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for p in e.speech:
        if p.on != "gpu":
            table.add_row(p.name, "CPU: not modelled", "", "")
            continue
        unit = p.run_unit[:-1] if p.runs == 1 else p.run_unit
        table.add_row(p.name, _fmt(p.total_ms), f"{p.runs} {unit}", _fmt(p.per_run_ms))
    table.add_row("tokens per second", _fmt(e.throughput_tokens_per_s, 3), f"({e.tokens})", "")
    table.add_row("total GPU time (s)", _fmt(e.runtime_ms / 1000 if e.runtime_ms else None, 3), "", "")
    return table


def _ops_table(e: Estimate, title: str) -> Table:
    table = Table(title=title, header_style="bold")
    for col in ("op", "count", "GFLOP", "MB moved", "GPU time (ms)", "% of step", "bound"):
        table.add_column(col, justify="left" if col in ("op", "bound") else "right")
    for r in e.top_ops:
        table.add_row(r.name, str(r.count), f"{r.flops / 1e9:,.2f}", f"{r.bytes / 1e6:,.1f}", f"{r.time_ms:,.3f}",
                      f"{100 * r.share:.1f}%", r.bound)
    return table


def _notes(e: Estimate, notes: list[str] | None) -> None:
    for a in e.assumptions + (notes or []):
        console.print(f"[yellow]note:[/] {a}")
    if e.unknown_ops:
        console.print(f"[yellow]ops the formula registry does not know (costed as memory-bound copies):[/] "
                      f"{', '.join(e.unknown_ops)}")


def print_op_table(e: Estimate) -> None:
    console.print(_ops_table(e, f"{e.model}: traced ops ({e.workload.phase}, share of time on {e.device})"))
    _notes(e, None)


def print_list(what: str) -> None:
    from . import catalog, specs

    if what == "models":
        for name in catalog.model_names():
            console.print(name)
    elif what == "devices":
        table = Table(header_style="bold")
        for col in ("name", "aliases", "GPU", "memory (GB)", "fp16 TFLOP/s", "bandwidth (GB/s)", "calibrated"):
            table.add_column(col)
        for key, g in specs.all_hardware().items():
            try:
                own = specs.calibration_path(g.name) is not None
                calibrated = ("yes" if specs.load_calibration(g.name).measured else
                              "no (its own rules file)" if own else "no (default rules)")
            except specs.SpecFileError as exc:  # one broken file must not break the listing
                console.print(f"[yellow]warning:[/] {exc}", soft_wrap=True)
                calibrated = "calibration file broken"
            table.add_row(key, ", ".join(g.aliases), g.display_name, f"{g.memory_bytes / 1e9:.1f}",
                          f"{g.peak_for('fp16') / 1e12:.0f}", f"{g.memory_bw_bytes_per_s / 1e9:.0f}", calibrated)
        for key, s in specs.all_systems().items():
            table.add_row(key, ", ".join(s.aliases), f"{s.gpu_count} x {s.gpu} ({s.interconnect.kind})", "", "", "",
                          "")
        console.print(table)
        console.print("Any GPU name takes a suffix xN for N GPUs in one host (e.g. l40sx4).")
    else:
        for key, r in specs.all_runtimes().items():
            console.print(f"{key}: {r.description}")


def print_serve_bench(bench) -> None:
    """One table per shard count, in the layout of TGI's text-generation-benchmark report."""
    console.print(f"[bold]{bench.model}[/] on {bench.device}: sequence length {bench.seq}, decode length "
                  f"{bench.decode_len}, {bench.dtype}, quant {bench.quant}, runtime {bench.runtime}")
    for shard in bench.shards:
        table = Table(title=f"Tensor Parallel - {shard.shards} GPU(s) ({shard.device})", header_style="bold")
        for col in ("Batch", "Prefill (ms)", "Decode token (ms)", "Decode total (ms)",
                    "Prefill throughput (req/s)", "Decode throughput (tokens/s)"):
            table.add_column(col, justify="right")
        for r in shard.rows:
            if not r.fits:
                table.add_row(str(r.batch), "[red]does not fit[/]", "", "", "", r.not_fit_reason or "")
                continue
            table.add_row(str(r.batch), _fmt(r.prefill_ms), _fmt(r.decode_token_ms), _fmt(r.decode_total_ms),
                          _fmt(r.prefill_throughput_requests_per_s), _fmt(r.decode_throughput_tokens_per_s))
        console.print(table)
    for a in bench.assumptions:
        console.print(f"[yellow]note:[/] {a}")


# vLLM bench serve's printout (vllm/benchmarks/serve.py `benchmark`, as of commit 009e6d4): its labels, its order
SERVE_HEAD = (("completed", "Successful requests"), ("failed", "Failed requests"),
              ("max_concurrency", "Maximum request concurrency"),
              ("duration_s", "Benchmark duration (s)"), ("total_input_tokens", "Total input tokens"),
              ("total_output_tokens", "Total generated tokens"), ("request_throughput", "Request throughput (req/s)"),
              ("request_goodput", "Request goodput (req/s)"), ("output_throughput", "Output token throughput (tok/s)"),
              ("max_output_tokens_per_s", "Peak output token throughput (tok/s)"),
              ("max_concurrent_requests", "Peak concurrent requests"),
              ("total_token_throughput", "Total token throughput (tok/s)"))
SERVE_SECTIONS = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
                  ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"),
                  ("client_queue_time", "Client Queue Time", "Client-side Queueing"))
# what only a simulator sees; the energy: the serving GPUs' steps plus their waiting power between steps (at a low
# rate mostly waiting: `estimate --workload generate` prices one request alone)
SERVE_EXTRA = (("energy_j_per_output_token", "Energy (J/output token, waiting between steps included)"),
               ("kv_cache_peak_utilization", "KV cache peak utilization"), ("num_preemptions", "Preemptions"),
               ("prefix_cache_hit_tokens", "Prefix cache hits (tokens not recomputed after preemption)"),
               ("mean_running_batch_size", "Mean running batch (sequences/step)"))


def _percentile_rows(m: dict, metric: str) -> list[tuple[str, str]]:
    """(key, 'P99 TTFT (ms)') for the run's percentiles of a metric, in percentile order."""
    keys = [k for k in m if k.startswith("p") and k.endswith(f"_{metric}_ms")]
    return sorted(((k, f"P{k[1:].split('_')[0]}") for k in keys), key=lambda kv: float(kv[1][1:]))


def print_serve(r, notes: list[str] | None = None) -> None:
    """`aisim serve`'s summary, in the order and names of vLLM's bench-serve printout, then aisim's own rows."""
    m = r.metrics
    ep = f" ep {r.plan.ep}" if r.plan.ep > 1 else ""
    table = Table(title=f"{r.model} on {r.device}: {r.runtime}, tp {r.plan.tp} pp {r.plan.pp}{ep}, {r.replicas} "
                        f"replica(s)", header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    none_done = not m.get("completed")     # no request finished: latencies are undefined, not 0

    def cell(key: str, digits: int = 2) -> str:
        value = m.get(key)
        if none_done and key.endswith("_ms"):
            return "n/a"
        if value is None or isinstance(value, int):
            return str(value)
        return f"{value:,.{digits}f}"        # fixed decimals at any size, as vLLM's {:<10.2f} (with separators)

    rate = (getattr(r, "load", None) or {}).get("request_rate")
    for key, label in SERVE_HEAD:
        if m.get(key) is not None:
            table.add_row(label, cell(key))
        if key == "max_concurrency" and isinstance(rate, (int, float)):      # vLLM prints it for a finite rate
            table.add_row("Request rate configured (RPS)", f"{rate:,.2f}")
    for metric, name, header in SERVE_SECTIONS:
        if metric == "client_queue_time" and m.get("mean_client_queue_time_ms") is None:   # --max-concurrency only
            continue
        table.add_section()
        table.add_row(f"[dim]{header}[/]", "")
        table.add_row(f"Mean {name} (ms)", cell(f"mean_{metric}_ms"))
        table.add_row(f"Median {name} (ms)", cell(f"median_{metric}_ms"))
        for key, p in _percentile_rows(m, metric):
            table.add_row(f"{p} {name} (ms)", cell(key))
    table.add_section()
    table.add_row("[dim]aisim[/]", "")
    for key, label in SERVE_EXTRA:
        table.add_row(label, cell(key, 3 if key in ("kv_cache_peak_utilization", "energy_j_per_output_token") else 2))
    console.print(table)
    for note in notes or []:
        console.print(f"[yellow]note:[/] {note}")


PLAN_COLUMNS = ("device", "runtime", "tp", "replicas", "gpus", "max_num_seqs", "dtype", "quant", "median_ttft_ms",
                "median_tpot_ms", "p90_tpot_ms", "output_tokens_per_s_per_gpu", "max_output_tokens_per_s_per_gpu",
                "usd_per_hour", "usd_per_million_output_tokens", "joules_per_output_token", "kwh_per_day",
                "electricity_usd_per_day", "co2_kg_per_day")


def _plan_row(c, columns: tuple[str, ...]) -> list:
    values = c.model_dump()
    return [values[k] if k in values else _metric(c.metrics, k) for k in columns]


def write_plan_csv(result, path) -> None:
    """The ranked configurations; the latency columns are the medians, p90 TPOT and every metric the SLO names."""
    import csv

    columns = PLAN_COLUMNS + tuple(k for k in result.slo if k not in PLAN_COLUMNS
                                   and k.replace("p50_", "median_") not in PLAN_COLUMNS)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for c in result.ranked:
            w.writerow(["" if v is None else v for v in _plan_row(c, columns)])


def _metric(metrics: dict, key: str):
    """A latency metric by its SLO name (median_* is also p50_*)."""
    return metrics.get(key, metrics.get(key.replace("median_", "p50_")))


def _metric_label(key: str) -> str:
    """'p90_ttft_ms' -> 'p90 TTFT ms'."""
    return " ".join(w.upper() if w in ("ttft", "tpot", "itl", "e2el") else w for w in key.split("_"))


def print_plan(result) -> None:
    slo = ", ".join(f"{k} <= {v:g}" for k, v in result.slo.items()) or "none"
    console.print(f"[bold]{result.model}[/] at {result.rate_per_s:g} req/s, SLO {slo}: {result.considered} "
                  f"configurations considered, {result.simulated} simulated")
    table = Table(title="cheapest configuration per GPU that meets the SLOs (latencies: one replica at the rate / "
                  "replicas; tok/s/GPU at the load, max: one replica saturated)", header_style="bold")
    # the latency columns are the SLO's own metrics where it names one (p90 TTFT, ...), else the medians
    ttft = next((k for k in result.slo if "ttft" in k), "median_ttft_ms")
    tpot = next((k for k in result.slo if "tpot" in k), "median_tpot_ms")
    extra = [k for k in result.slo if k not in (ttft, tpot)]   # the SLO's other limits (e2el, itl, a 2nd TTFT)
    for col in ("device", "runtime", "tp x replicas", "max seqs", "GPUs", _metric_label(ttft), _metric_label(tpot),
                *map(_metric_label, extra), "tok/s/GPU", "max tok/s/GPU", "$/hour", "$/M out tok", "J/tok",
                "kWh/day"):
        table.add_column(col, justify="right")
    if not result.cheapest_per_device:
        console.print("[red]no configuration meets the SLOs within --max-gpus[/]; why, per GPU and runtime:")
    for c in result.cheapest_per_device.values():
        table.add_row(c.device, c.runtime, f"{c.tp} x {c.replicas}", str(c.max_num_seqs), str(c.gpus),
                      _fmt(_metric(c.metrics, ttft)), _fmt(_metric(c.metrics, tpot)),
                      *(_fmt(_metric(c.metrics, k)) for k in extra),
                      _fmt(c.output_tokens_per_s_per_gpu, 1), _fmt(c.max_output_tokens_per_s_per_gpu, 1),
                      _fmt(c.usd_per_hour),
                      _fmt(c.usd_per_million_output_tokens, 3), _fmt(c.joules_per_output_token, 3),
                      _fmt(c.kwh_per_day, 1))
    if result.cheapest_per_device:
        console.print(table)
    for key, why in result.not_feasible.items():
        console.print(f"[red]{key}:[/] {why}")
    for a in result.assumptions:
        console.print(f"[yellow]note:[/] {a}")


def train_plan_rows(ranked: list, top: int) -> list:
    """The rows plan train prints: the fastest plan of every (device, GPU count) first, fastest first, then the
    next fastest plans up to ``top`` rows (a group whose best is slower than another group's tenth still shows)."""
    best: dict = {}
    for c in ranked:   # ranked is fastest first
        best.setdefault((c.device, c.gpus), c)
    firsts = list(best.values())
    rest = [c for c in ranked if all(c is not b for b in firsts)]
    return firsts + rest[:max(top - len(firsts), 0)]


def print_train_plan(result, top: int) -> None:
    table = Table(title=f"{result.model}: {result.considered} candidates, {sum(result.pruned.values())} pruned, "
                        f"{result.evaluated} costed, {len(result.ranked)} fit; the fastest per device and GPU "
                        "count, then the next fastest", header_style="bold")
    moe = any(c.ep > 1 for c in result.ranked)
    for col in ("device", "GPUs", "tp.pp.dp" + (".ep" if moe else ""), "ZeRO", "recomp", "mb x acc", "MFU", "days",
                "GB/GPU", "$", "MWh"):
        table.add_column(col, justify="right")
    for c in train_plan_rows(result.ranked, top):
        table.add_row(c.device, str(c.gpus), f"{c.tp}.{c.pp}.{c.dp}" + (f".{c.ep}" if moe else ""), str(c.zero),
                      c.recompute,
                      f"{c.micro_batch} x {c.grad_accum}", f"{c.mfu:.0%}", _fmt(c.time_to_train_days, 3),
                      f"{c.memory_per_gpu_gb:.1f}", _fmt(c.usd, 0), _fmt(c.energy_mwh, 3))
    if result.ranked:
        console.print(table)
    else:
        console.print("[red]no plan fits[/]; why, per device and GPU count:")
    for key, why in result.not_feasible.items():
        console.print(f"[red]{key}:[/] {why}")
    for a in result.assumptions:
        console.print(f"[yellow]note:[/] {a}")
