"""Request-level simulation of a continuous-batching LLM server (vLLM v1 style), as a library.

    request (workload, replicas, router, engine overrides) + step timer + engine config
      -> workload (requests.py) -> replica schedulers (engine.py) driven in time (simulate.py)
      -> ServeResult with `vllm bench serve` metric names (metrics.py)

The step timer is the only link to a cost model (steptime.py): give it a BatchShape, get seconds and joules.
Like Vidur, the scheduler (engine.py) is kept apart from the execution-time predictor (the timer) and from the
metrics (metrics.py).

Example::

    from aisim.studies.serve import EngineConfig, LinearStepTimer, ServeRequest, simulate_serving
    timer = LinearStepTimer(base_s=5e-3, per_token_s=3e-5, per_decode_ctx_token_s=1.6e-7, power_w=700)
    result = simulate_serving(ServeRequest(num_requests=1000, rate_per_s=20), timer,
                              EngineConfig(num_kv_blocks=8000))
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from aisim.errors import AisimError

from .engine import EngineConfig
from .metrics import RequestTable, ServeResult, SteadyWindow, steady_window, summarize, token_times, write_requests_csv
from .requests import MAX_REQUESTS, Workload, parse_arrival_cv, parse_length, read_trace, synth_workload
from .simulate import ProgressFn, simulate
from .steptime import BatchShape, LinearStepTimer, StepTimer

__all__ = ["BatchShape", "EngineConfig", "LinearStepTimer", "RequestTable", "ServeRequest", "ServeResult",
           "ServeRun", "StepTimer", "Workload", "build_workload", "read_trace", "run_serving", "simulate_serving",
           "validated", "write_requests_csv"]

M = TypeVar("M", bound=BaseModel)


def _arrival_spec(spec: str) -> str:
    parse_arrival_cv(spec)       # a one-line AisimError for a spec it does not take
    return spec


# an arrival process, checked where a request model takes one (ServeRequest, plan serve's request)
ArrivalSpec = Annotated[str, AfterValidator(_arrival_spec)]


def validated(model: type[M], data: dict[str, Any], flags: dict[str, str] | None = None) -> M:
    """model(**data), with pydantic's multi-line errors turned into one-line AisimErrors. ``flags`` maps field
    names to the command-line flags that set them: an error then names the flag and the value given
    ("--rate: Input should be greater than 0 (got 0.0)"), as ``estimate``'s errors do."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"]) or model.__name__
            if flags and err["loc"] and err["loc"][0] in flags:
                parts.append(f"{flags[err['loc'][0]]}: {err['msg']} (got {err.get('input')!r})")
                continue
            close = difflib.get_close_matches(where, list(model.model_fields), n=1)
            hint = f" (did you mean {close[0]}?)" if err["type"] == "extra_forbidden" and close else ""
            parts.append(f"{where}: {err['msg']}{hint}")
        if flags and all(p.startswith("--") for p in parts):
            raise AisimError("; ".join(parts)) from None
        known = ", ".join(model.model_fields)
        raise AisimError(f"bad {model.__name__}: {'; '.join(parts)} (fields: {known})") from None


class ServeRequest(BaseModel):
    """What to simulate: the workload, the replicas and router, and engine settings to override.

    A trace (trace_path) replaces num_requests, input_len, output_len, rate_per_s and arrival.
    """

    model_config = ConfigDict(extra="forbid")

    num_requests: int = Field(1000, ge=1, le=MAX_REQUESTS)
    input_len: str = Field("sharegpt", description="N, uniform:LO:HI, normal:MEAN:SD, lognormal:MEAN:SIGMA, "
                                                   "sharegpt")
    output_len: str = Field("sharegpt", description="as input_len")
    rate_per_s: float = Field(math.inf, gt=0, description="mean request rate over all replicas; inf = all at t = 0")
    arrival: ArrivalSpec = Field("poisson", description="poisson or gamma:CV")
    seed: int = Field(0, ge=0, le=2**63 - 1)
    trace_path: Path | None = Field(None, description="CSV or JSONL with arrival_s,input_tokens,output_tokens")
    replicas: int = Field(1, ge=1, le=4096)
    router: Literal["round-robin", "least-loaded"] = "round-robin"
    max_concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS, description="as vLLM's --max-concurrency: the "
                                         "client keeps at most this many requests in flight")
    lockstep: int = Field(1, ge=1, le=4096, description="replicas per group stepping together: the data-parallel "
                                                         "ranks of one expert-parallel group (ep / tp); 1: independent")
    engine_overrides: dict[str, Any] = Field(default_factory=dict, description="EngineConfig fields to replace")
    metric_percentiles: list[float] = Field(default_factory=lambda: [90.0, 99.0],
                                            description="as vLLM's --metric-percentiles")
    goodput: dict[Literal["ttft", "tpot", "e2el"], float] = Field(
        default_factory=dict, description="as vLLM's --goodput: per-request limits in milliseconds")

    @field_validator("goodput")
    @classmethod
    def _goodput(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not (math.isfinite(x) and x >= 0)}
        if bad:
            raise AisimError(f"goodput limits must be non-negative milliseconds, got {bad}")
        return v

    @field_validator("input_len")
    @classmethod
    def _input_len(cls, v: str) -> str:
        parse_length(v, "input")
        return v

    @field_validator("output_len")
    @classmethod
    def _output_len(cls, v: str) -> str:
        parse_length(v, "output")
        return v

    @field_validator("metric_percentiles")
    @classmethod
    def _percentiles(cls, v: list[float]) -> list[float]:
        if not v or not all(0 < p <= 100 for p in v):
            raise AisimError(f"metric_percentiles must be a non-empty list of numbers in (0, 100], got {v}")
        return v


@dataclass(frozen=True)
class ServeRun:
    """A run's summary, its per-request records (for write_requests_csv), and every output token's emission time
    with the id of its request (grouped by request, in time order within each)."""

    result: ServeResult
    requests: RequestTable
    token_time_s: np.ndarray
    token_request_id: np.ndarray
    steady: SteadyWindow | None = None   # between warm-up and drain (plan serve's steady-state energy)
    arrival_offset_s: float = 0.0        # a trace's first arrival in its own clock (times count from it)


def build_workload(request: ServeRequest) -> Workload:
    if request.trace_path is not None:
        return read_trace(request.trace_path)
    return synth_workload(request.num_requests, request.input_len, request.output_len, request.rate_per_s,
                          request.arrival, request.seed)


def _engine(engine_config: EngineConfig, overrides: dict[str, Any]) -> EngineConfig:
    if not overrides:
        return engine_config
    return validated(EngineConfig, {**engine_config.model_dump(), **overrides})


def run_serving(request: ServeRequest, timer: StepTimer, engine_config: EngineConfig,
                progress: ProgressFn | None = None) -> ServeRun:
    """Simulate the request's workload; progress(done, total) is called as requests finish."""
    if not isinstance(timer, StepTimer):
        raise AisimError(f"timer must have step_time_s(shape) and step_energy_j(shape), got {type(timer).__name__}")
    if not isinstance(engine_config, EngineConfig):
        raise AisimError(f"engine_config must be an EngineConfig, got {type(engine_config).__name__}")
    engine = _engine(engine_config, request.engine_overrides)
    workload = build_workload(request)
    run = simulate(workload, timer, engine, replicas=request.replicas, router=request.router, progress=progress,
                   lockstep=request.lockstep, max_concurrency=request.max_concurrency)
    tokens = token_times(run)
    result, table = summarize(run, request.metric_percentiles, tokens, request.goodput)
    return ServeRun(result, table, *tokens, steady=steady_window(run), arrival_offset_s=workload.offset_s)


def simulate_serving(request: ServeRequest, timer: StepTimer, engine_config: EngineConfig,
                     progress: Callable[[int, int], None] | None = None) -> ServeResult:
    """The ServeResult of simulating `request` with `timer` on replicas configured by `engine_config`."""
    return run_serving(request, timer, engine_config, progress).result

