"""The `aisim serve` front: options -> Scenario (resolved once) + ServeRequest -> the simulation -> a typed
ServeReport (vLLM bench-serve names, plus the scenario and engine it ran)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ...errors import AisimError, DoesNotFit
from ...scenario import ScenarioRequest, build_request, resolve_scenario
from ...workload import ParallelPlan
from . import ServeRequest, ServeResult, validated
from .metrics import GOODPUT_METRICS
from .requests import parse_arrival_cv
from .run import failure_summary, serve


class ServeReport(BaseModel):
    """`aisim serve --json`: the run's metrics (vLLM bench-serve names) and what was simulated."""
    model: str
    device: str
    runtime: str
    plan: ParallelPlan
    replicas: int
    engine: dict[str, Any]
    metrics: dict[str, float | int | str | None]
    load: dict[str, float | int | str | None] = Field(
        default_factory=dict, description="what was offered (vLLM's result JSON names where it has them: "
        "num_prompts, request_rate, burstiness; and the length and arrival specs, the seed, or the trace)")
    assumptions: list[str] = Field(default_factory=list)


SERVE_FLAGS = {"num_requests": "--num-requests", "input_len": "--input-len", "output_len": "--output-len",
               "rate_per_s": "--rate", "arrival": "--arrival", "seed": "--seed", "trace_path": "--trace",
               "replicas": "--replicas", "router": "--router", "metric_percentiles": "--metric-percentiles",
               "goodput": "--goodput", "max_concurrency": "--max-concurrency"}


def _percentiles(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise AisimError(f"--metric-percentiles takes comma-separated numbers, e.g. 50,90,99 (got {text!r})") from None
    return values


SERVE_DTYPES = ("auto", "fp16", "bf16", "fp32")


def parse_goodput(text: str) -> dict[str, float]:
    """vLLM's --goodput: KEY:VALUE pairs (ttft, tpot, e2el; milliseconds), separated by spaces or commas."""
    out: dict[str, float] = {}
    for item in text.replace(",", " ").split():
        key, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if key.lower() not in GOODPUT_METRICS or not 0 <= ms < math.inf:
            raise AisimError(f"--goodput takes KEY:MILLISECONDS pairs, KEY one of {', '.join(GOODPUT_METRICS)}, as "
                             f"vLLM's (e.g. --goodput 'ttft:300 tpot:50'); got {item!r}")
        if key.lower() in out:
            raise AisimError(f"--goodput gives {key.lower()} twice ({out[key.lower()]:g} and {ms:g} ms); give each "
                             "limit once")
        out[key.lower()] = ms
    return out


def run_serve(*, model, device, dtype, tp, pp, quant, runtime, calibration, num_requests, input_len, output_len,
              ep: int = 1,
              kv_dtype="auto",
              rate, arrival, seed, trace: Path | None, replicas, router, percentiles: str, knobs: dict,
              progress: bool = False, ignored: tuple[str, ...] = (), goodput: str = "",
              max_concurrency: int | None = None):
    """``ignored``: load options the caller was given beside --trace (named in a note: the trace replaces them)."""
    if dtype not in SERVE_DTYPES:   # vLLM's --dtype choices (auto, half, float16, bfloat16, float, float32)
        raise AisimError(f"--dtype: give one of {', '.join(SERVE_DTYPES)}, the dtypes a serving engine runs (got "
                         f"{dtype!r})")
    base = build_request(ScenarioRequest, model=model, device=device, dtype=dtype, tp=tp, pp=pp, ep=ep, quant=quant,
                         kv_dtype=kv_dtype, runtime=runtime, calibration=calibration)
    first = resolve_scenario(base.model_copy(update={"tp": tp or 1}), "prefill")
    # no --tp on a device of several GPUs: the smallest power-of-two degree a replica fits at (as one sets vLLM's
    # --tensor-parallel-size), the other GPUs replicas; one GPU, or --tp / --replicas given: as asked
    tries = [tp or 1] if tp is not None or replicas is not None or first.device.count == 1 else \
        [2 ** i for i in range(0, 17) if 2 ** i * pp <= first.device.count and first.device.count % (2 ** i * pp) == 0]
    refusal, tried = None, []
    for i, t in enumerate(tries):   # tries[0] is the degree ``first`` resolved
        try:                # a degree the model's heads do not divide (or KV heads replicate past): the next
            sc = first if i == 0 else resolve_scenario(base.model_copy(update={"tp": t}), "prefill")
        except AisimError:
            continue
        try:
            report, run, notes = _run_at_tp(sc, replicas, num_requests=num_requests,
                                            input_len=input_len, output_len=output_len, rate=rate, arrival=arrival,
                                            seed=seed, trace=trace, router=router, percentiles=percentiles,
                                            knobs=knobs, progress=progress, ignored=ignored, goodput=goodput,
                                            max_concurrency=max_concurrency)
        except DoesNotFit as exc:
            refusal = refusal or exc
            tried.append(t)
            continue
        break
    else:
        if len(tried) > 1:      # every degree searched: say so, not "e.g. --tp N" for one already tried
            raise refusal.advise(f"no tensor-parallel degree of {first.device.name}'s GPUs fits "
                                 f"(tp {', '.join(map(str, tried))} tried): a smaller --quant or a larger GPU")
        raise refusal
    if refusal is not None:     # tp 1 did not fit: the degree taken and why
        notes = [f"--tp not given: tp {t}, the smallest tensor-parallel degree a replica of {report.model} fits at "
                 f"on {report.device} (at tp 1 {refusal.detail})", *notes]
        report = report.model_copy(update={"assumptions": notes})
    return report, run, notes


def _run_at_tp(sc, replicas, *, num_requests, input_len, output_len, rate, arrival, seed, trace,
               router, percentiles, knobs, progress, ignored, goodput, max_concurrency):
    """One serve run of the resolved scenario ``sc`` (its tp), its replicas on the device's other GPUs."""
    given = replicas is not None
    replicas = replicas if given else sc.plan.dp
    if not 1 <= replicas <= 4096:
        raise AisimError(f"--replicas must be between 1 and 4096 (got {replicas}); leave it out for GPUs / (tp x pp)"
                         if given else f"{sc.device.name} holds {replicas} replicas of tp {sc.plan.tp} x pp "
                         f"{sc.plan.pp}, more than the 4096 aisim serve simulates: give --replicas N (the other GPUs "
                         "idle) or a device with fewer GPUs")
    per_replica = sc.plan.tp * sc.plan.pp
    if replicas * per_replica > sc.device.count:
        raise AisimError(f"--replicas {replicas} x tp {sc.plan.tp} x pp {sc.plan.pp} needs "
                         f"{replicas * per_replica} GPUs, but {sc.device.name} has {sc.device.count}: lower "
                         f"--replicas to {sc.device.count // per_replica} or less, or give a device with more GPUs "
                         f"(-d NAMExN, e.g. -d {sc.device.gpu.name}x{replicas * per_replica})")
    # vLLM's expert parallelism beyond the TP group spans data-parallel ranks, which step together
    lockstep = sc.plan.ep // sc.plan.tp if sc.plan.ep > sc.plan.tp else 1
    if lockstep > 1 and sc.runtime.name != "vllm":
        raise AisimError(f"--ep {sc.plan.ep} over tp {sc.plan.tp} is vLLM's data parallel + expert parallel, which "
                         f"{sc.runtime.name} has no engine for: give --tp {sc.plan.ep} (experts spread over one "
                         "replica's GPUs) or --runtime vllm")
    if replicas % lockstep:
        raise AisimError(f"--ep {sc.plan.ep} over tp {sc.plan.tp} spreads the experts over {lockstep} data-parallel "
                         f"ranks that step together (vLLM's data parallel + expert parallel): give --replicas as a "
                         f"multiple of {lockstep}, or --tp {sc.plan.ep} to keep expert parallelism inside one replica")
    replica = sc.with_plan(sc.plan.model_copy(update={"dp": 1}))
    if math.isnan(rate):
        raise AisimError("--rate must be a positive number of requests per second, or inf")
    req = validated(ServeRequest, {"num_requests": num_requests, "input_len": input_len, "output_len": output_len,
                                   "rate_per_s": rate, "arrival": arrival, "seed": seed, "trace_path": trace,
                                   "replicas": replicas, "router": router, "lockstep": lockstep,
                                   "metric_percentiles": _percentiles(percentiles),
                                   "goodput": parse_goodput(goodput), "max_concurrency": max_concurrency},
                   SERVE_FLAGS)
    bar = _progress_bar() if progress else None
    try:
        run, cfg, notes = serve(replica, req, knobs, bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    used = replicas * per_replica
    # serve's data-parallel degree is --replicas: its default says so, or is dropped when --replicas is given
    notes = [n.replace("--dp not given", "--replicas not given").replace(
                 "as Megatron and vLLM infer it", "each its own engine behind the router (one vllm serve runs "
                 "data_parallel_size 1 unless told)") for n in notes if not (given and n.startswith("--dp not given"))]
    notes = [n.replace("change --tp/--dp", "change --tp/--replicas") for n in notes]
    if used < sc.device.count:
        notes.append(f"{used} of {sc.device.name}'s {sc.device.count} GPUs serve ({replicas} replica(s) of tp "
                     f"{sc.plan.tp} x pp {sc.plan.pp}); the other {sc.device.count - used} idle, not counted in the "
                     "energy")
    if trace is not None and ignored:
        notes.append(f"--trace gives the requests: {', '.join(ignored)} ignored")
    if run.result.completed == 0:
        overridden = knobs.get("num_gpu_blocks_override") is not None
        raise AisimError(f"no request completed: {failure_summary(run, cfg, overridden) or 'none was simulated'}")
    load = ({"trace": str(trace), "num_prompts": run.result.completed + run.result.failed} if trace is not None else
            {"num_prompts": num_requests, "request_rate": rate if math.isfinite(rate) else "inf",
             "burstiness": _burstiness(arrival), "arrival": arrival, "input_len": input_len, "output_len": output_len,
             "seed": seed})
    load["max_concurrency"] = max_concurrency
    metrics = {**run.result.flat(), "duration": run.result.duration_s}    # vLLM's key beside aisim's duration_s
    report = ServeReport(model=sc.model, device=sc.device.name, runtime=sc.runtime.name, plan=replica.plan,
                         replicas=replicas, engine=cfg.model_dump(), metrics=metrics, load=load, assumptions=notes)
    return report, run, notes


def _burstiness(arrival: str) -> float:
    """vLLM's --burstiness (the gamma shape: 1 is Poisson) of an arrival spec: poisson, or gamma:CV (shape 1/CV^2)."""
    cv = parse_arrival_cv(arrival)
    return 1.0 / cv ** 2 if cv else 1.0


class _progress_bar:
    """A rich progress bar on stderr for long simulations (requests finished / total)."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
        self.task = None

    def update(self, done: int, total: int) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("serve", total=total)
        self.progress.update(self.task, completed=done)

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()


__all__ = ["ServeReport", "run_serve", "ServeResult"]
