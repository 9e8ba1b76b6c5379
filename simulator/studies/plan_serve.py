"""`aisim plan serve`: the cheapest serving configuration per GPU that meets every SLO at a load.

Search space: device x runtime (engines with a serving profile) x tensor-parallel degree x engine knobs
(max_num_seqs) x replicas. For each (device, runtime, tp, knobs) the analytical model prunes first: the weights
and a KV cache must fit (aisim.studies.serve.run.kv_capacity), and one replica's saturated throughput (a
simulation at rate = inf at full concurrency, _min_replicas) bounds the replicas needed from below; then the
request-level simulator of one replica at its share of the load (rate / replicas: a round-robin split of Poisson
arrivals is Poisson) checks the SLOs at that replica count and the next ones, up to --max-gpus. Every candidate
considered is counted (pruned or simulated).

Costs: $/hour = GPUs x price per GPU-hour (the GPU spec's default price, or --price); $ per million output tokens
= $/hour / (output tokens per hour) x 1e6, where a replica's output tokens per second at its share of the load are
the offered load (rate / replicas x the output tokens per simulated request): a stable queue serves what arrives
(the search simulates only shares within a replica's saturated throughput), and a finite run's duration adds the
drain after the last arrival; power from the steps' energy in the run's steady window (after a quarter of the
arrivals, up to the last; a run too short for one is lengthened) plus the GPUs' waiting power while no step runs;
J per output token = that power / the offered tokens per second; kWh per day = that power x 24 h x PUE; CO2 per
day = kWh x grid intensity.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..catalog import HOST_SWITCH_GPUS, gpus_device, node_system, resolve_gpu, resolve_model
from ..errors import AisimError, DoesNotFit, UnknownNameError
from ..graph.engine import moe_routing
from ..plan import check_tp
from ..scenario import Scenario, ScenarioRequest, calibration_note, resolve_scenario, serving_notes
from ..specs import all_hardware, all_runtimes
from .common import price_notes, refuse_gpu_count
from .serve import ArrivalSpec, ServeRequest, ServeRun, validated
from .serve.metrics import ServeResult, percentile_key
from .serve.requests import parse_length
from .serve.run import (SERVE_ENERGY_NOTE, VLLM_UNMEASURED_NOTE, engine_config, failure_summary,
                         refuse_encoder_decoder, serve)

SLO_KEY = re.compile(r"^(mean|median|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
HOURS_PER_DAY = 24.0
SATURATION_SEQS_FACTOR = 8   # the saturated bound run: this many requests per max_num_seqs (see _min_replicas)
STEADY_WINDOW_E2EL = 4.0     # a run at the load covers this many mean end-to-end latencies between warm-up and drain
MAX_STEADY_REQUESTS = 20_000


@dataclass
class _Search:
    """What the search counts and collects across devices, runtimes and tp degrees."""

    considered: int = 0
    simulated: int = 0
    scenario_notes: dict[tuple[str, str, int], list[str]] = field(default_factory=dict)
    uncalibrated: set[str] = field(default_factory=set)
    capacity_bound: bool = False   # some configuration saturated within --max-gpus or did not fit
    # (device, runtime, tp) -> {max_num_seqs: (one replica's saturated req/s, the fewest replicas simulated)}, for the
    # note saying why fewer replicas are not ranked
    saturation: dict[tuple[str, str, int], dict[int, tuple[float, int]]] = field(default_factory=dict)


class PlanServeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    model: str
    devices: list[str] = Field(min_length=1)
    runtimes: list[str] = Field(default_factory=lambda: ["transformers-cb"], min_length=1)
    rate_per_s: float = Field(gt=0, le=1e6)
    input_len: str = "sharegpt"
    output_len: str = "sharegpt"
    num_requests: int = Field(400, ge=20, le=100_000, description="requests per simulation")
    arrival: ArrivalSpec = Field("poisson", description="poisson or gamma:CV; each replica's share of the arrivals is "
                         "simulated with the same process at rate / replicas, as a Poisson stream's always was: "
                         "conservative, since a round-robin share of a renewal stream sums `replicas` gaps (CV / "
                         "sqrt(replicas))")
    slo: dict[str, float] = Field(default_factory=dict)
    max_gpus: int = Field(8, ge=1, le=100_000)
    max_num_seqs: list[int | None] = Field(default_factory=lambda: [None, 64, 16])
    tp: list[int] = Field(None, min_length=1, description="tensor-parallel degrees of a replica to search "
                                 "(default: 1, 2, 4, 8 and each power of two up to max_gpus)")
    enable_expert_parallel: bool = Field(False, description="MoE: experts spread over each replica's tp GPUs (vLLM "
                                         "--enable-expert-parallel), not every expert split over them")
    power_limit_w: float | None = Field(None, gt=0, description="board power limit of every GPU (W)")
    gpu_clock_mhz: float | None = Field(None, gt=0, description="core clock cap of every GPU (MHz)")
    dtype: Literal["auto", "fp16", "bf16", "fp32"] = "auto"
    quant: Literal["none", "int8", "fp8", "int4"] = "none"
    kv_dtype: Literal["auto", "fp16", "bf16", "fp8"] = "auto"
    prices: dict[str, float] = Field(default_factory=dict, description="device name -> USD per GPU-hour")
    electricity_usd_per_kwh: float = Field(0.10, ge=0)
    pue: float = Field(1.2, ge=1.0, le=3.0)
    grid_g_co2_per_kwh: float | None = Field(None, ge=0)
    seed: int = 0

    @field_validator("tp")
    @classmethod
    def _tp_degrees(cls, tp: list[int]) -> list[int]:
        if any(t < 1 for t in tp):
            raise ValueError("tensor-parallel degrees are positive integers, e.g. 1,2,4")
        return sorted(set(tp))

    @model_validator(mode="before")
    @classmethod
    def _default_tp(cls, data):
        if isinstance(data, dict) and data.get("tp") is None:   # a node's degrees, and whole nodes where
            gpus = data.get("max_gpus", 8)                        # --max-gpus reaches past one (h100 x 16)
            extra = [2 ** i for i in range(4, 20) if isinstance(gpus, int) and 2 ** i <= gpus]
            data = {**data, "tp": [1, 2, 4, 8] + extra}
        return data

    @field_validator("slo")
    @classmethod
    def _slo_keys(cls, slo: dict[str, float]) -> dict[str, float]:
        """Every spelling parse_slo takes (ttft_p90_ms, p90.0_ttft_ms, p50 for median), as the API's callers too."""
        return parse_slo(",".join(f"{k}={v!r}" for k, v in slo.items())) if slo else slo


class Candidate(BaseModel):
    device: str
    runtime: str
    tp: int
    replicas: int
    gpus: int
    max_num_seqs: int
    dtype: str = Field("", description="the compute dtype (--dtype auto resolves it per GPU)")
    quant: str = "none"
    meets_slo: bool
    metrics: dict[str, int | float] = Field(description="one replica's simulation at its share of the rate "
                                                       "(vLLM bench-serve names; counts are integers)")
    price_usd_per_gpu_hour: float | None
    usd_per_hour: float | None
    usd_per_million_output_tokens: float | None
    joules_per_output_token: float
    kwh_per_day: float
    electricity_usd_per_day: float
    co2_kg_per_day: float | None
    output_tokens_per_s_per_gpu: float = Field(description="at the offered load: rate x output tokens / GPUs")
    output_tokens_per_s_per_user: float = Field(description="1000 / median TPOT at the load")
    max_output_tokens_per_s_per_gpu: float = Field(0.0, description="what one replica carries saturated (the "
                                                   "replica bound's runs), per GPU: the configuration's capacity")
    memory_note: str = ""


class PlanServeResult(BaseModel):
    model: str
    rate_per_s: float
    slo: dict[str, float]
    considered: int = Field(description="candidate configurations considered (pruned analytically or simulated)")
    simulated: int = Field(description="configurations simulated at their share of the rate (each (device, "
                           "runtime, tp, max_num_seqs) is also simulated once saturated to bound its replicas)")
    ranked: list[Candidate] = Field(description="every simulated configuration that meets the SLOs, cheapest first")
    cheapest_per_device: dict[str, Candidate]
    min_gpus_per_device: dict[str, int]
    pareto: list[Candidate] = Field(description="output tok/s per GPU vs tok/s per user, non-dominated")
    not_feasible: dict[str, str] = Field(default_factory=dict)
    assumptions: list[str] = Field(default_factory=list)


def _normal_key(key: str) -> str:
    """The simulation's own name for an SLO metric: p90.0 -> p90 (metrics.percentile_key), p50 -> median."""
    m = re.match(r"^p(\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$", key)
    if m:
        key = percentile_key(float(m.group(1)), m.group(2))
    return key.replace("p50_", "median_")


def parse_slo(text: str) -> dict[str, float]:
    """'ttft_p90_ms=2000,tpot_p50_ms=50' or vLLM-style 'p90_ttft_ms=2000' (or '<=', as the plan prints it) ->
    {'p90_ttft_ms': 2000, ...}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("<=") if "<=" in part else part.partition("=")
        key = key.strip()
        m = re.match(r"^(ttft|tpot|itl|e2el)_(mean|median|p\d+(\.\d+)?)_ms$", key)
        if m:
            key = f"{m.group(2)}_{m.group(1)}_ms"
        key = _normal_key(key)
        if not SLO_KEY.match(key):
            raise AisimError(f"--slo {part!r}: name a latency like ttft_p90_ms, tpot_p50_ms, e2el_p99_ms or "
                             "mean_tpot_ms, then =milliseconds")
        pct = re.match(r"^p(\d+(?:\.\d+)?)_", key)
        if pct and not 0 < float(pct.group(1)) < 100:
            raise AisimError(f"--slo {part!r}: a percentile between 0 and 100 (exclusive), e.g. p90 or p99.9")
        if key in out:
            raise AisimError(f"--slo {part!r}: {key} is given twice; give each limit once")
        try:
            out[key] = float(value)
        except ValueError:
            raise AisimError(f"--slo {part!r}: the limit must be a number of milliseconds") from None
        if not math.isfinite(out[key]) or out[key] <= 0:
            raise AisimError(f"--slo {part!r}: the limit must be a positive number of milliseconds")
    return out


def _devices(names: list[str]) -> list[str]:
    """The GPU names to search; 'all': every priced NVIDIA GPU (the runtimes' kernels are NVIDIA's)."""
    if names == ["all"]:
        return [k for k, g in all_hardware().items() if g.vendor == "nvidia" and g.price_usd_per_gpu_hour]
    out = []
    for n in names:
        refuse_gpu_count(n, "plan serve", "up to --max-gpus")
        out.append(resolve_gpu(n).name)
    return list(dict.fromkeys(out))    # h100, h100-sxm and H100 are one GPU


def _slo_value(metrics: dict, key: str) -> float:
    if key in metrics:
        return metrics[key]
    if key.startswith("median_") and key.replace("median_", "p50_") in metrics:
        return metrics[key.replace("median_", "p50_")]
    raise AisimError(f"SLO {key}: the simulation has no such metric")


def _slo_load(c: "Candidate", slo: dict[str, float]) -> float:
    """How close a configuration runs to its SLOs: the largest metric / limit (median TPOT without SLOs)."""
    if not slo:
        return c.metrics.get("median_tpot_ms") or math.inf
    return max(_slo_value(c.metrics, k) / v for k, v in slo.items())


def _meets(metrics: dict, slo: dict[str, float]) -> bool:
    return all(_slo_value(metrics, k) <= v for k, v in slo.items())


def plan_serve(req: PlanServeRequest, progress: Callable[[str], None] | None = None) -> PlanServeResult:
    percentiles = sorted({50.0, 90.0, 99.0} | {float(k.split("_")[0][1:]) for k in req.slo if k.startswith("p")})
    search = _Search()
    found: list[Candidate] = []
    infeasible: dict[str, str] = {}
    notes: set[str] = set()
    model, config = resolve_model(req.model)   # the resolved name, as `aisim serve` reports it
    moe = moe_routing(config) is not None
    if req.enable_expert_parallel and not moe:
        notes.add(f"--enable-expert-parallel: {model} has no experts; like vLLM's flag, it changes nothing")
    notes.add("each configuration's metrics (latencies, request_throughput, duration_s, completed) are one "
              "replica's finite simulation at rate / replicas with the router's even share (lengthened to cover "
              f"{STEADY_WINDOW_E2EL:g} mean end-to-end latencies between its warm-up and its drain); the deployment's "
              "tok/s, $, J/tok and kWh/day are at its steady state: the offered load (rate x output tokens per "
              "request), the steady window's step energy plus the GPUs' waiting power between steps (the "
              "calibration's waiting_power_w)")
    notes.add("J/tok and kWh/day: " + SERVE_ENERGY_NOTE.removeprefix("energy: "))
    notes.add(f"kWh/day = the GPUs' energy x the data center's PUE {req.pue:g} (--pue); J/tok is the GPUs' own")
    if "vllm" in req.runtimes:
        notes.add(VLLM_UNMEASURED_NOTE)
    if req.devices == ["all"]:
        others = sorted(k for k, g in all_hardware().items() if g.vendor != "nvidia" or not g.price_usd_per_gpu_hour)
        notes.add("--devices all searched the priced NVIDIA GPUs; not searched (name them in --devices, with "
                  "--price where they have none): " + ", ".join(others))
    _check_request(req, config, model, percentiles, notes)
    notes.update(price_notes({g.name: g for g in map(resolve_gpu, _devices(req.devices))}, req.prices))
    serving = sorted(k for k, v in all_runtimes().items() if v.serving is not None)
    for runtime in dict.fromkeys(req.runtimes):     # every name checked before any search
        if runtime not in all_runtimes():
            raise UnknownNameError("runtime", runtime, serving, f"Serving runtimes: {', '.join(serving)}.")
        if runtime not in serving:
            raise AisimError(f"runtime {runtime!r} has no serving profile: give one of {', '.join(serving)}")
    for device in _devices(req.devices):
        for runtime in dict.fromkeys(req.runtimes):
            reason = _search_device(req, device, runtime, percentiles, search, found, notes, progress, moe)
            if reason:
                infeasible[f"{device}/{runtime}"] = reason
    for (device, runtime, tp), by_seqs in sorted(search.saturation.items()):
        pruned = [(seqs, cap, low) for seqs, (cap, low) in sorted(by_seqs.items(), reverse=True)
                  if 1 < low <= max(req.max_gpus // tp, 1)]
        if pruned:
            notes.add(f"{device}/{runtime} tp {tp}: one replica saturates at " + ", ".join(
                f"{cap:.2f} req/s with max_num_seqs {seqs} (at least {low} replicas)" for seqs, cap, low in pruned)
                + f" for {req.rate_per_s:g} req/s: fewer replicas are not simulated")
    if not search.simulated and not search.capacity_bound:
        # nothing could run, and not for want of GPUs (a setting every device refuses, requests no engine takes):
        # an error; a rate beyond --max-gpus or a model that does not fit is the plan's answer, with its reasons
        raise AisimError("plan serve found no configuration to simulate: "
                         + "; ".join(f"{k}: {v}" for k, v in infeasible.items()))
    # every configuration serves the same offered load, so equal GPUs at one price tie on $/M: the one further
    # inside its SLOs (the largest metric / limit; without SLOs, median TPOT) comes first, and on a full tie (a
    # load that never fills the smaller max_num_seqs) the larger one, the engine's default
    ok = sorted((c for c in found if c.meets_slo),   # SLO headroom to 2 significant digits: a hair is a tie
                key=lambda c: (c.usd_per_million_output_tokens or math.inf, c.gpus,
                               float(f"{_slo_load(c, req.slo):.2g}"), -c.max_num_seqs))
    cheapest, min_gpus = {}, {}
    for c in ok:
        cheapest.setdefault(c.device, c)
        min_gpus[c.device] = min(min_gpus.get(c.device, c.gpus), c.gpus)
    for c in cheapest.values():
        load = c.output_tokens_per_s_per_gpu / c.max_output_tokens_per_s_per_gpu \
            if c.max_output_tokens_per_s_per_gpu else 0.0
        if load > HEADROOM_NOTE_LOAD:
            notes.add(f"{c.device} tp {c.tp} x {c.replicas}: the load is {load:.0%} of its saturated capacity; near "
                      "saturation queues grow fast, so a few percent more load or burstier arrivals (--arrival "
                      "gamma:2) miss the SLOs: plan at a higher --rate for headroom")
    front = pareto(ok)
    for c in [*cheapest.values(), *front]:   # the configurations the table and the plot show
        notes.update(search.scenario_notes.get((c.device, c.runtime, c.tp), ()))
    foreign = sorted({c.device for c in [*cheapest.values(), *front] if resolve_gpu(c.device).vendor != "nvidia"})
    if foreign:   # their default rules and the engines' kernels are NVIDIA's: rows to read as rough
        notes.add(f"{', '.join(foreign)}: spec-only, rough: the default efficiency rules were measured on NVIDIA "
                  "GPUs and the engine profiles model CUDA kernels; no calibration of this vendor's GPUs exists "
                  "(see the notes of its spec file)")
    if search.uncalibrated:
        notes.add(f"no measured calibration for {', '.join(sorted(search.uncalibrated))}: efficiencies and overheads "
                  "are documented rules (hardware_specs/calibration/), not measurements; `aisim calibrate` on such a "
                  "GPU measures them")
    return PlanServeResult(model=model, rate_per_s=req.rate_per_s, slo=req.slo, considered=search.considered,
                           simulated=search.simulated, ranked=ok, cheapest_per_device=cheapest,
                           min_gpus_per_device=min_gpus, pareto=front, not_feasible=infeasible,
                           assumptions=sorted(merge_per_gpu_notes(notes)))


_PER_GPU_NOTE = re.compile(r"^(--dtype auto on |no system spec file for )([\w.-]+?)(x\d+)?: ")


def merge_per_gpu_notes(notes) -> list[str]:
    """Notes that say the same of several GPUs ('--dtype auto on l4: bf16 (...)', 'no system spec file for b200x2:
    ...') said once, naming the GPUs (a search over every GPU printed one per GPU)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    out = []
    for note in notes:
        m = _PER_GPU_NOTE.match(note)
        if m is None:
            out.append(note)
            continue
        name = m[2] + (m[3] or "")
        key = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", "\0", note)
        groups.setdefault(key, []).append((name, note))
    for key, members in groups.items():
        if len(members) == 1:
            out.append(members[0][1])
            continue
        names = ", ".join(sorted((n for n, _ in members),
                                 key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]))
        head, _, rest = key.partition("\0")
        out.append(head + names + rest.replace("\0", "each"))
    return out


def _scenario_request(req: PlanServeRequest, gpu, runtime: str, tp: int, moe: bool) -> ScenarioRequest:
    """One candidate's scenario: tp GPUs of ``gpu``; experts spread over them with --enable-expert-parallel."""
    return ScenarioRequest(model=req.model, device=gpus_device(gpu, tp), dtype=req.dtype, tp=tp, quant=req.quant,
                           kv_dtype=req.kv_dtype, runtime=runtime, ep=tp if req.enable_expert_parallel and moe else 1,
                           power_limit_w=req.power_limit_w, gpu_clock_mhz=req.gpu_clock_mhz)


def _check_request(req: PlanServeRequest, config: dict, model: str, percentiles, notes: set[str]) -> None:
    """What is wrong with the request whatever the GPU, said once before the search: the request lengths, an
    encoder-decoder model, --tp degrees the model's heads or --max-gpus rule out (named in a note where others
    remain)."""
    validated(ServeRequest, {"num_requests": req.num_requests, "input_len": req.input_len,
                             "output_len": req.output_len, "rate_per_s": req.rate_per_s, "seed": req.seed,
                             "arrival": req.arrival, "metric_percentiles": percentiles}, PLAN_SERVE_FLAGS)
    refuse_encoder_decoder(model, config)
    dropped = {}
    for tp in req.tp:
        if tp > req.max_gpus:
            dropped[tp] = f"above --max-gpus {req.max_gpus}"
            continue
        errors = []
        for runtime in dict.fromkeys(req.runtimes):   # vLLM replicates KV heads over more GPUs than it has
            spec = all_runtimes().get(runtime)
            try:
                check_tp(config, tp, "all", bool(spec and spec.replicate_kv_heads))
            except AisimError as exc:
                errors.append(str(exc))
        if len(errors) == len(dict.fromkeys(req.runtimes)):
            dropped[tp] = errors[0]
    if len(dropped) == len(req.tp):
        raise AisimError("no --tp degree can be searched: " + "; ".join(f"tp {t}: {why}" for t, why in dropped.items()))
    for tp, why in dropped.items():
        if tp <= req.max_gpus:   # a degree above --max-gpus is left out without a word (the default list has 8)
            notes.add(f"--tp {tp} not searched: {why}")


def _search_device(req, device, runtime, percentiles, search, found, notes, progress, moe: bool) -> str | None:
    gpu = resolve_gpu(device)
    try:   # a setting this GPU refuses whatever the plan (a power limit above its board power): said as its reason
        resolve_scenario(_scenario_request(req, gpu, runtime, 1, moe), "prefill")
    except AisimError as exc:
        return str(exc)
    # a simulated tp's reason comes first, then a larger replica's saturation bound, then a smaller one's not fitting
    shape_reason, last_reason, fit_reason = "no tensor-parallel degree fits", None, None
    fewest = None   # the saturated configuration that would need the fewest GPUs: the bound worth reporting
    for tp in (t for t in req.tp if t <= req.max_gpus):
        if tp > HOST_SWITCH_GPUS and gpu.nvlink_kind == "switch" and gpus_device(gpu, tp).system is None:
            system = node_system(gpu)
            notes.add(f"--tp {tp} not searched on {gpu.name}: one host joins at most {HOST_SWITCH_GPUS} of them, and "
                      + (f"{tp} GPUs are not whole nodes of {system.name}" if system is not None else
                         "no multi-node system file of it (gpus_per_node, network) is shipped: add one under "
                         "hardware_specs/systems/ to search tensor parallelism across nodes"))
            continue
        search.considered += len(req.max_num_seqs) * max(req.max_gpus // tp, 1)
        try:
            base = _scenario_request(req, gpu, runtime, tp, moe)
            sc = resolve_scenario(base, "prefill")
            check_tp(sc.config, tp, "all", sc.runtime.replicate_kv_heads)
        except AisimError as exc:
            shape_reason = str(exc)
            continue
        # what estimate and serve say of this configuration (fp8 fallback, MoE sharding...), reported for the
        # configurations the plan picks; the GPUs without a measured calibration, in one note
        search.scenario_notes[(gpu.name, runtime, tp)] = serving_notes(sc)
        if calibration_note(sc):
            search.uncalibrated.add(gpu.name)
        for seqs in req.max_num_seqs:
            knobs = {"max_num_seqs": seqs} if seqs else {}
            try:
                cand = _min_replicas(req, sc, tp, knobs, percentiles, search, notes)
            except Saturated as exc:
                search.capacity_bound = True
                if fewest is None or exc.gpus < fewest.gpus:
                    fewest = exc
                continue
            except DoesNotFit as exc:   # serve's advice names serve's flags; the plan searches --tp and --max-gpus
                fit_reason, search.capacity_bound = str(exc.advise(PLAN_FIT_HINT) if exc.hint else exc), True
                continue
            except AisimError as exc:
                last_reason = str(exc)
                continue
            if progress:
                progress(f"{device} {runtime} tp {tp} seqs {seqs or 'default'}")
            if cand is not None:
                found.append(cand)
            else:
                last_reason = (f"tp {tp}, max_num_seqs {seqs or 'default'}: no replica count up to --max-gpus "
                               f"{req.max_gpus} completed the requests")
    mine = [c for c in found if c.device == gpu.name and c.runtime == runtime]
    if not mine:   # a configuration that failed for another reason comes first: the saturation bound is not why
        if last_reason:
            return last_reason + (f"; the fewest-GPU saturation bound: {fewest}" if fewest is not None else "")
        if fewest is not None:   # the replicas that fit cannot carry the rate: that is the answer
            return str(fewest) + (f" (smaller replicas: {fit_reason})" if fit_reason else "")
        return fit_reason or shape_reason
    if not any(c.meets_slo for c in mine):
        best = {k: min(_slo_value(c.metrics, k) for c in mine) for k in req.slo}
        return ("no configuration up to --max-gpus {} meets the SLOs; the best reached: {}".format(
            req.max_gpus, ", ".join(f"{k} {v:.1f} ms" for k, v in best.items())))
    return None


def _simulate(req: "PlanServeRequest", sc: Scenario, knobs: dict, replicas: int, percentiles: list[float],
              search: "_Search", rate_per_s: float | None = None, num_requests: int | None = None):
    """One replica at its share of the rate (or saturated at ``rate_per_s`` = inf). A run at the load whose steady
    window (warm-up and drain excluded) is shorter than STEADY_WINDOW_E2EL mean end-to-end latencies is run again
    with proportionally more requests (at most MAX_STEADY_REQUESTS): 40 requests at 500 req/s arrive in 0.08 s,
    and such a run is its warm-up and drain, its latencies and energy too."""
    search.simulated += int(rate_per_s is None)   # a configuration at the load; the saturated run is its bound
    per_replica = (rate_per_s or req.rate_per_s) / replicas
    n = num_requests or req.num_requests
    while True:
        sreq = validated(ServeRequest, {"num_requests": n, "input_len": req.input_len, "output_len": req.output_len,
                                        "rate_per_s": per_replica, "seed": req.seed, "arrival": req.arrival,
                                        "metric_percentiles": percentiles})
        run, cfg, _ = serve(sc, sreq, knobs)
        need_s = STEADY_WINDOW_E2EL * run.result.mean_e2el_ms / 1e3
        steady_enough = run.steady is None or run.steady.duration_s >= need_s
        if rate_per_s is not None or steady_enough or n >= MAX_STEADY_REQUESTS:
            return run, cfg
        n = min(MAX_STEADY_REQUESTS, math.ceil(n * need_s / max(run.steady.duration_s, 1e-9)) + 1)


# advice where a configuration does not fit: the plan searches the tp degrees and replica counts itself
PLAN_FIT_HINT = "search more GPUs (--max-gpus, --tp), a smaller --quant or a larger GPU"
PLAN_KV_FIX = "search more GPUs per replica (--tp, --max-gpus) or a larger GPU"


class Saturated(AisimError):
    """Even --max-gpus replicas of one configuration cannot carry the rate (``gpus``: the GPUs it would need)."""

    def __init__(self, message: str, gpus: int):
        super().__init__(message)
        self.gpus = gpus


def _min_replicas(req, sc, tp, knobs, percentiles, search, notes) -> Candidate | None:
    """The fewest replicas that meet the SLOs (None when even max_gpus do not), from the saturation bound up.

    The bound is one replica's saturated throughput, the larger of two runs at rate = inf: --num-requests, and
    SATURATION_SEQS_FACTOR x max_num_seqs requests (the engine full for most of the run). With only the first (400
    by default, fewer than vLLM's 1024 sequences) every request was admitted at once and the run was mostly its
    drain: Llama-3-8B under vllm on an H100 saturated at 37.9 req/s with 400 ShareGPT requests, 72.1 with 8,000.
    An engine whose steps slow down with concurrency (transformers-cb's packed attention) saturates higher with
    fewer requests in flight. A bound from below must not prune a replica count that can carry the rate, so it
    takes the larger; the simulation at the load then decides."""
    max_seqs = engine_config(sc, knobs)[0].max_num_seqs
    capacity = 0.0
    for n in sorted({req.num_requests, max(req.num_requests, SATURATION_SEQS_FACTOR * max_seqs)}):
        run, cfg = _simulate(req, sc, knobs, 1, percentiles, search, rate_per_s=math.inf, num_requests=n)
        sat = run.result
        if sat.failed and set(sat.failed_reasons) == {"max_model_len"} and sat.completed:
            # the engine rejects a request longer than the model's context whatever the plan: plan for the others
            notes.add(f"{sat.failed_reasons['max_model_len']} of {sat.completed + sat.failed} simulated requests "
                      f"are over the model's max_model_len {cfg.max_model_len} and rejected, as the engine rejects "
                      "them; the plan serves the rest")
        elif sat.failed:      # requests no replica count can run (the KV cache, the batch): say why, as serve
            why = f"tp {tp}: {failure_summary(run, cfg, kv_fix=PLAN_KV_FIX)}"
            raise DoesNotFit(why) if "kv_capacity" in sat.failed_reasons else AisimError(why)
        # requests per second of the arrival stream: the ones over max_model_len are rejected at once
        capacity = max(capacity, sat.request_throughput * (sat.completed + sat.failed) / max(sat.completed, 1))
    max_replicas = max(req.max_gpus // tp, 1)
    low = max(1, math.ceil(req.rate_per_s / capacity)) if capacity > 0 else max_replicas + 1
    key = (sc.device.gpu.name, sc.runtime.name, tp)
    search.saturation.setdefault(key, {})[cfg.max_num_seqs] = (capacity, low)
    if low > max_replicas:
        raise Saturated(f"one tp-{tp} replica (max_num_seqs {cfg.max_num_seqs}) saturates at {capacity:.2f} req/s: "
                        f"{req.rate_per_s:g} req/s needs at least {low} replicas ({low * tp} GPUs) > --max-gpus "
                        f"{req.max_gpus}", low * tp)
    best, previous = None, None
    for replicas in range(low, max_replicas + 1):
        run, cfg = _simulate(req, sc, knobs, replicas, percentiles, search)
        result = run.result
        if result.failed and set(result.failed_reasons) != {"max_model_len"}:
            continue
        best = _candidate(req, sc, tp, replicas, cfg.max_num_seqs, run, capacity)
        if best.meets_slo or (previous is not None and not _improved(previous, best, req.slo)):
            break   # more replicas only shorten queues: once the SLO latencies stop falling, none will meet them
        previous = best
    notes.add(f"{sc.runtime.name}: engine defaults as serving.source in its runtime spec cites them "
              "(hardware_specs/runtimes/ or $AISIM_SPECS_DIR/runtimes/)")
    return best


# the share of a configuration's saturated throughput above which its plan gets a headroom note
HEADROOM_NOTE_LOAD = 0.9


def _improved(before: Candidate, after: Candidate, slo: dict[str, float], rel: float = 0.02) -> bool:
    """Whether one more replica lowered any SLO latency by more than ``rel``."""
    return any(_slo_value(after.metrics, k) < (1 - rel) * _slo_value(before.metrics, k) for k in slo)


def output_tokens_per_arrival(r: ServeResult, output_len: str) -> float:
    """Output tokens each arriving request brings: the mean of ``output_len``'s distribution (not of the simulated
    sample, whose mean moves with --num-requests: ShareGPT's by about 7% between 400 and 4,000 requests); where the
    engine rejected requests (over max_model_len), which bring none and are the long ones, the sample's. Times a
    rate, the offered load: a stable queue serves what arrives (the search simulates only replica counts whose share
    of the rate is within one replica's saturated throughput); a finite run's own output_throughput divides by a
    duration that includes the drain after the last arrival."""
    if not r.failed:
        return parse_length(output_len, "output").expected_tokens()
    return r.total_output_tokens / max(r.completed + r.failed, 1)


def steady_power_w(run: ServeRun) -> float:
    """One replica's average draw at its share of the load, all tp GPUs: its energy over the steady window (warm-up
    and drain excluded): its steps', and the GPUs' power while they wait between steps (the calibration's
    waiting_power_w: a loaded serving process, not the datasheet's empty idle; metrics.steady_window). The whole
    run where it has no window (its steps back to back)."""
    w, r = run.steady, run.result
    if w is None:
        return r.energy_j / max(r.duration_s, 1e-9)
    return w.energy_j / (w.duration_s * w.replicas)


def _candidate(req, sc, tp, replicas, max_num_seqs, run: ServeRun, capacity_req_s: float = 0.0) -> Candidate:
    r = run.result
    metrics = r.flat()
    gpus = tp * replicas
    price = req.prices.get(sc.device.gpu.name, sc.device.gpu.price_usd_per_gpu_hour)
    per_arrival = output_tokens_per_arrival(r, req.output_len)
    tokens_per_s = req.rate_per_s * per_arrival   # the offered load, carried by the replicas together
    usd_h = gpus * price if price else None
    watts = steady_power_w(run) * replicas   # the GPUs' average draw at the load
    j_per_tok = watts / tokens_per_s if tokens_per_s else r.energy_j_per_output_token
    kwh_day = watts * HOURS_PER_DAY / 1e3 * req.pue
    tpot = r.median_tpot_ms or math.inf
    return Candidate(device=sc.device.gpu.name, runtime=sc.runtime.name, tp=tp, replicas=replicas, gpus=gpus,
                     max_num_seqs=max_num_seqs, dtype=sc.dtype, quant=sc.quant, meets_slo=_meets(metrics, req.slo),
                     metrics={k: v for k, v in metrics.items()
                              if isinstance(v, (int, float)) and k != "replicas"},   # the simulated one replica
                     price_usd_per_gpu_hour=price, usd_per_hour=usd_h,
                     usd_per_million_output_tokens=(usd_h / (tokens_per_s * 3600) * 1e6
                                                    if usd_h and tokens_per_s else None),
                     joules_per_output_token=j_per_tok, kwh_per_day=kwh_day,
                     electricity_usd_per_day=kwh_day * req.electricity_usd_per_kwh,
                     co2_kg_per_day=(kwh_day * req.grid_g_co2_per_kwh / 1e3 if req.grid_g_co2_per_kwh is not None
                                     else None),
                     output_tokens_per_s_per_gpu=tokens_per_s / gpus,
                     output_tokens_per_s_per_user=1e3 / tpot if tpot and math.isfinite(tpot) else 0.0,
                     max_output_tokens_per_s_per_gpu=capacity_req_s * per_arrival / tp)


def pareto(cands: list[Candidate]) -> list[Candidate]:
    """Non-dominated candidates on (output tok/s per GPU, output tok/s per user), both higher is better."""
    front = [c for c in cands if not any(
        o.output_tokens_per_s_per_gpu >= c.output_tokens_per_s_per_gpu
        and o.output_tokens_per_s_per_user >= c.output_tokens_per_s_per_user
        and (o.output_tokens_per_s_per_gpu, o.output_tokens_per_s_per_user)
        != (c.output_tokens_per_s_per_gpu, c.output_tokens_per_s_per_user) for o in cands)]
    return sorted(front, key=lambda c: c.output_tokens_per_s_per_user)


# PlanServeRequest field -> the `aisim plan serve` flag that sets it (errors name the flag)
PLAN_SERVE_FLAGS = {"arrival": "--arrival", "devices": "--devices", "runtimes": "--runtimes", "rate_per_s": "--rate",
                    "input_len": "--input-len", "output_len": "--output-len", "num_requests": "--num-requests",
                    "slo": "--slo", "max_gpus": "--max-gpus", "dtype": "--dtype", "quant": "--quant",
                    "kv_dtype": "--kv-dtype", "prices": "--price", "tp": "--tp",
                    "enable_expert_parallel": "--enable-expert-parallel", "power_limit_w": "--power-limit",
                    "gpu_clock_mhz": "--gpu-clock",
                    "electricity_usd_per_kwh": "--electricity-usd-per-kwh", "pue": "--pue",
                    "grid_g_co2_per_kwh": "--grid-g-co2-per-kwh"}


def plan_request(**fields) -> PlanServeRequest:
    return validated(PlanServeRequest, fields, PLAN_SERVE_FLAGS)
