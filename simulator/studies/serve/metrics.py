"""Serving metrics with the names and definitions of ``vllm bench serve`` (vllm/benchmarks/serve.py
`calculate_metrics`), plus what only a simulator can see (energy, KV-cache use, preemptions, batch size).

Per completed request: TTFT = first token time - arrival; E2EL = finish - arrival;
TPOT = (E2EL - TTFT) / (output_len - 1) for output_len > 1 (requests with one output token have no TPOT);
ITL = every gap between consecutive tokens of a request (stalls from preemption included), pooled over requests.
Throughputs divide by duration_s, the time from t = 0 (the start of the arrival process, as vLLM's benchmark
clock starts before the first request is sent) to the last finish. Means, medians, population standard
deviations and linear-interpolation percentiles, as numpy computes them in vLLM; an empty list gives 0.
Goodput (vLLM's --goodput): completed requests whose TTFT, TPOT (0 for one output token) and E2EL are each within
the given milliseconds, per second of duration_s. Peak output token throughput: the most tokens emitted in a
1-second bucket counted from the first arrival; peak concurrent requests: the most requests between arrival and
finish at once (vllm/benchmarks/serve.py calculate_metrics, as of commit 009e6d4).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from aisim.errors import AisimError

from .engine import DONE
from .simulate import SimRun

MS_PER_S = 1e3
METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")      # what vLLM's --goodput accepts


class ServeResult(BaseModel):
    """One simulated `vllm bench serve` run. Throughputs are per second of duration_s; *_ms are milliseconds."""

    model_config = ConfigDict(extra="forbid")

    completed: int
    failed: int = Field(description="requests rejected because they can never fit a replica")
    failed_reasons: dict[str, int] = Field(description="rejections by reason: kv_capacity, max_model_len, "
                                                       "max_num_batched_tokens")
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float = Field(description="completed requests per second")
    output_throughput: float = Field(description="output tokens per second")
    total_token_throughput: float = Field(description="input + output tokens per second")
    request_goodput: float | None = Field(None, description="completed requests within every --goodput limit per "
                                                            "second (None without --goodput)")
    max_output_tokens_per_s: float = Field(0.0, description="peak output tokens in a 1-second bucket")
    max_concurrent_requests: int = Field(0, description="peak requests between arrival and finish at once")
    max_concurrency: int | None = Field(None, description="the client's cap on requests in flight (vLLM's "
                                                          "--max-concurrency), if any")
    mean_client_queue_time_ms: float | None = Field(None, description="with max_concurrency: a request's wait for a "
                                                                      "slot before it is sent (its latencies count "
                                                                      "from the send)")
    median_client_queue_time_ms: float | None = None
    std_client_queue_time_ms: float | None = None
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    percentiles: dict[str, float] = Field(description="vLLM keys: p99_ttft_ms, p90_itl_ms, ... (milliseconds)")
    energy_j: float = Field(description="every replica's GPUs over duration_s: its steps' energies (the engine's "
                            "per-step host work at the step's power, attention graph builds at the waiting power) "
                            "plus the waiting power of the loaded process in the gaps between steps")
    energy_j_per_output_token: float
    kv_cache_peak_utilization: float = Field(description="peak used / total KV blocks, worst replica")
    num_preemptions: int
    prefix_cache_hit_tokens: int = Field(0, description="tokens (its prompt's and those it had generated) a "
                                                        "readmitted (preempted) request took back from the prefix "
                                                        "cache instead of recomputing them")
    mean_running_batch_size: float = Field(description="sequences per step, mean over steps")
    mean_requests_in_system: float = Field(description="time-average of waiting + running + swapped requests, "
                                                       "summed over replicas (Little's L)")
    num_steps: int
    replicas: int
    router: str

    def flat(self) -> dict[str, float | int | str | None]:
        """The result as one flat dict with vLLM's key names (percentiles as p99_ttft_ms, ...)."""
        out = self.model_dump(exclude={"percentiles", "failed_reasons"})
        out.update(self.percentiles)
        return out


@dataclass(frozen=True)
class RequestTable:
    """Per-request records (NaN where a request has no value: rejected, or TPOT with one output token)."""

    request_id: np.ndarray
    replica: np.ndarray
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    completed: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2el_ms: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    tokens_emitted: np.ndarray
    client_queue_ms: np.ndarray


@dataclass(frozen=True)
class SteadyWindow:
    """The run between its warm-up and its drain: from the arrival of the first quarter's last request to the last
    arrival. What the replicas' steps did in it (the part of each step inside it), summed over the replicas."""

    start_s: float
    end_s: float
    energy_j: float
    busy_s: float
    replicas: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def steady_window(run: SimRun) -> SteadyWindow | None:
    """The steady part of a run at a finite rate (None at rate = inf, or with under 4 requests). A step that
    straddles an edge counts for the part of it inside the window, its energy pro rata; between steps each
    replica's GPUs draw their idle power (ReplicaStats.idle_power_w), as in ServeResult.energy_j."""
    arrivals = np.sort([r.arrival_s for r in run.requests])
    if len(arrivals) < 4:
        return None
    start, end = float(arrivals[len(arrivals) // 4]), float(arrivals[-1])
    if end <= start:
        return None
    energy = busy = 0.0
    for st in run.replicas:
        ends = np.asarray(st.step_end_s, dtype=np.float64)
        steps = np.asarray(st.step_s, dtype=np.float64)
        inside = np.clip(np.minimum(ends, end) - np.maximum(ends - steps, start), 0.0, None)
        share = np.divide(inside, steps, out=np.zeros_like(steps), where=steps > 0)
        energy += float(np.dot(share, np.asarray(st.step_energy_j, dtype=np.float64)))
        energy += max(end - start - float(inside.sum()), 0.0) * st.idle_power_w
        busy += float(inside.sum())
    return SteadyWindow(start, end, energy, busy, len(run.replicas))


OVERLOAD_MIN_REQUESTS = 50
OVERLOAD_FEW_REQUESTS = 10
OVERLOAD_SLOW_SHARE = 0.5       # completions under half the rate of a server that keeps up: behind, at any length
OVERLOAD_GROWTH_SHARE = 0.1     # requests in the system growing by more than this share of the arrivals ...
# ... and by more than this many standard deviations of the difference of two Poisson counts (sqrt of their sum),
# plus 2 requests: a server keeping up at 20 req/s with ~30 requests in flight swings by 20 between two instants
OVERLOAD_NOISE_SIGMAS = 3.0


def overload(table: RequestTable, unloaded_s: float) -> tuple[float, int, int] | str | None:
    """(arrival rate, requests in the system at the middle of the arrivals' span, at the last arrival) when the server
    falls behind: between the two, the requests arrived and not yet finished grew by more than a tenth of the
    arrivals there and beyond their noise (the queue, or the running batch, builds: every latency then depends
    on the run's length). "short" when the arrivals last less than twice ``unloaded_s`` (a typical request's
    latency alone on the engine): the system is still filling, nothing more can be told. Whatever the length, a run
    whose completions come at under half the rate a server keeping up would reach (its requests over the arrivals'
    span plus ``unloaded_s``) falls behind. None when it keeps up, with under 10 completed requests (under 50 for
    the growth test), or all arrivals at once."""
    ok = table.completed                        # rejected requests never enter the system
    arrival, finish = table.arrival_s[ok], table.finish_s[ok]
    if len(arrival) < OVERLOAD_FEW_REQUESTS:
        return None
    start, end = float(arrival.min()), float(arrival.max())
    if end <= start:
        return None
    mid = (start + end) / 2                    # a trace's clock need not start at 0
    in_mid = int((arrival <= mid).sum() - (finish <= mid).sum())
    in_end = int((arrival <= end).sum() - (finish <= end).sum())
    arrived = int(((arrival > mid) & (arrival <= end)).sum())
    # however short the run: completions far slower than a server keeping up would finish them (the arrivals' span
    # plus a request's latency alone) are a server falling behind
    if len(arrival) / float(finish.max() - start) < OVERLOAD_SLOW_SHARE * len(arrival) / (end - start + unloaded_s):
        return arrived / (end - mid), in_mid, in_end
    if unloaded_s >= mid - start:
        return "short"
    if len(arrival) < OVERLOAD_MIN_REQUESTS:
        return None
    growth = in_end - in_mid
    if growth <= OVERLOAD_GROWTH_SHARE * arrived or growth <= OVERLOAD_NOISE_SIGMAS * math.sqrt(in_mid + in_end) + 2:
        return None
    return arrived / (end - mid), in_mid, in_end


def percentile_key(p: float, metric: str) -> str:
    """vLLM's name for a percentile: p99_ttft_ms, p99.9_itl_ms."""
    word = str(int(p)) if float(p) == int(p) else f"{p:g}"
    return f"p{word}_{metric}_ms"


def _stats(metric: str, values_s: np.ndarray, percentiles: list[float]) -> tuple[dict, dict]:
    ms = values_s * MS_PER_S if len(values_s) else np.zeros(1)
    main = {f"mean_{metric}_ms": float(np.mean(ms)), f"median_{metric}_ms": float(np.median(ms)),
            f"std_{metric}_ms": float(np.std(ms))}
    pcts = {percentile_key(p, metric): float(np.percentile(ms, p)) for p in percentiles}
    return main, pcts


def token_times(run: SimRun) -> tuple[np.ndarray, np.ndarray]:
    """Emission time of every output token of the completed requests, and the request id owning each, grouped by
    request in request order, each request's tokens in time order.

    A request's tokens come from runs of consecutive steps (segments) of its replica; the token times are those
    steps' end times. Vectorised: index = segment first step + position within the segment.
    """
    done = [r for r in run.requests if r.state == DONE]
    offsets = np.cumsum([0] + [len(st.step_end_s) for st in run.replicas])
    all_steps = np.concatenate([np.asarray(st.step_end_s, dtype=np.float64) for st in run.replicas] or [[]])
    firsts = [s for r in done for s in r.segments[0::2]]
    lasts = [s for r in done for s in r.segments[1::2]]
    owners = [r.rid for r in done for _ in range(len(r.segments) // 2)]
    if not owners:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    owners_a = np.asarray(owners, dtype=np.int64)
    first = np.asarray(firsts, dtype=np.int64) + offsets[run.replica_of[owners_a]]
    lengths = np.asarray(lasts, dtype=np.int64) - np.asarray(firsts, dtype=np.int64) + 1
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return all_steps[np.repeat(first, lengths) + within], np.repeat(owners_a, lengths)


def request_table(run: SimRun, token_owner: np.ndarray | None = None) -> RequestTable:
    """Per-request records; token_owner (request id of every emitted token) is computed when not given."""
    reqs = run.requests
    n = len(reqs)
    nan = float("nan")
    arrival = np.array([r.arrival_s for r in reqs])
    first = np.array([r.first_token_s if r.state == DONE else nan for r in reqs], dtype=np.float64)
    finish = np.array([r.finish_s if r.state == DONE else nan for r in reqs], dtype=np.float64)
    out = np.array([r.output_tokens for r in reqs], dtype=np.int64)
    ttft, e2el = first - arrival, finish - arrival    # from the send (after a --max-concurrency wait), as vLLM
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2el - ttft) / (out - 1), nan)
    if token_owner is None:
        _, token_owner = token_times(run)
    return RequestTable(
        request_id=np.arange(n), replica=run.replica_of.copy(), arrival_s=arrival,
        input_tokens=np.array([r.input_tokens for r in reqs], dtype=np.int64), output_tokens=out,
        completed=np.array([r.state == DONE for r in reqs]), ttft_ms=ttft * MS_PER_S, tpot_ms=tpot * MS_PER_S,
        e2el_ms=e2el * MS_PER_S, finish_s=finish, preemptions=np.array([r.preemptions for r in reqs]),
        client_queue_ms=(arrival - np.array([r.scheduled_s for r in reqs])) * MS_PER_S,
        tokens_emitted=np.bincount(token_owner, minlength=n))


def _throughputs(table: RequestTable, duration_s: float) -> dict:
    ok = table.completed
    total_in, total_out = int(table.input_tokens[ok].sum()), int(table.output_tokens[ok].sum())
    per_s = (1.0 / duration_s) if duration_s > 0 else 0.0
    return {"completed": int(ok.sum()), "duration_s": duration_s, "total_input_tokens": total_in,
            "total_output_tokens": total_out, "request_throughput": int(ok.sum()) * per_s,
            "output_throughput": total_out * per_s, "total_token_throughput": (total_in + total_out) * per_s}


def _goodput(table: RequestTable, goodput_ms: dict[str, float], duration_s: float) -> float:
    """Completed requests with every named metric within its limit, per second (vLLM's request_goodput)."""
    ok = table.completed.copy()
    values = {"ttft": table.ttft_ms, "tpot": np.nan_to_num(table.tpot_ms, nan=0.0), "e2el": table.e2el_ms}
    for metric, limit_ms in goodput_ms.items():
        ok &= values[metric] <= limit_ms
    return int(ok.sum()) / duration_s if duration_s > 0 else 0.0


def _peaks(table: RequestTable, times_s: np.ndarray) -> dict:
    """vLLM's peak output token throughput (1-second buckets from the first arrival of a completed request) and peak
    concurrent requests (half-open [arrival, finish) intervals, a finish before an arrival at the same time)."""
    ok = table.completed
    if not ok.any():
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start = float(table.arrival_s[ok].min())
    buckets = np.floor(times_s - start).astype(np.int64) if len(times_s) else np.zeros(0, dtype=np.int64)
    # the occupied buckets only: a long idle gap (a low rate, a trace's late arrival) makes no array of empty seconds
    per_s = np.unique(buckets[buckets >= 0], return_counts=True)[1] if len(buckets) else np.zeros(1)
    events = np.concatenate([np.stack([table.arrival_s[ok], np.ones(ok.sum())], 1),
                             np.stack([table.finish_s[ok], -np.ones(ok.sum())], 1)])
    order = np.lexsort((events[:, 1], events[:, 0]))
    return {"max_output_tokens_per_s": float(per_s.max()) if len(per_s) else 0.0,
            "max_concurrent_requests": int(np.cumsum(events[order, 1]).max())}


def _engine_stats(run: SimRun, duration_s: float, total_out: int) -> dict:
    reps = run.replicas
    steps = sum(st.work_steps for st in reps)       # a lockstep group's dummy batches are not the replica's steps
    # the GPUs draw their waiting power whenever no step runs, before the first arrival and after a replica's last
    # step included (a deployed server is up for the whole run)
    energy = sum(st.energy_j + max(duration_s - sum(st.step_s), 0.0) * st.idle_power_w for st in reps)
    return {"energy_j": energy, "energy_j_per_output_token": energy / total_out if total_out else 0.0,
            "kv_cache_peak_utilization": max(st.peak_used_blocks / st.num_kv_blocks for st in reps),
            "num_preemptions": sum(st.num_preemptions for st in reps),
            "prefix_cache_hit_tokens": sum(st.prefix_cache_hit_tokens for st in reps),
            "mean_running_batch_size": sum(st.batch_seqs_sum for st in reps) / steps if steps else 0.0,
            "mean_requests_in_system": sum(st.in_system_area for st in reps) / duration_s if duration_s else 0.0,
            "num_steps": steps, "replicas": len(reps), "router": run.router}


def summarize(run: SimRun, percentiles: list[float],
              tokens: tuple[np.ndarray, np.ndarray] | None = None,
              goodput_ms: dict[str, float] | None = None) -> tuple[ServeResult, RequestTable]:
    """The vLLM-named summary of a run, and its per-request table; tokens = token_times(run) if already known;
    goodput_ms: vLLM's --goodput limits (ttft, tpot, e2el in milliseconds), if any."""
    times, owner = tokens if tokens is not None else token_times(run)
    table = request_table(run, owner)
    ok = table.completed
    duration_s = float(np.max(table.finish_s[ok])) if ok.any() else 0.0
    same = owner[1:] == owner[:-1]
    itl_s = np.diff(times)[same]
    values = {"ttft": table.ttft_ms[ok] / MS_PER_S, "tpot": table.tpot_ms[ok & (table.output_tokens > 1)] / MS_PER_S,
              "itl": itl_s, "e2el": table.e2el_ms[ok] / MS_PER_S}
    fields: dict = _throughputs(table, duration_s)
    fields.update(_peaks(table, times))     # token_times holds the completed requests' tokens only
    if goodput_ms:
        fields["request_goodput"] = _goodput(table, goodput_ms, duration_s)
    if run.max_concurrency is not None:
        fields["max_concurrency"] = run.max_concurrency
        values["client_queue_time"] = table.client_queue_ms[ok] / MS_PER_S
    pcts: dict[str, float] = {}
    for metric in [m for m in (*METRICS, "client_queue_time") if m in values]:
        main, extra = _stats(metric, values[metric], percentiles)
        fields.update(main)
        pcts.update(extra)
    reasons: dict[str, int] = {}
    for r in run.requests:
        if r.reject_reason is not None:
            reasons[r.reject_reason] = reasons.get(r.reject_reason, 0) + 1
    fields.update(_engine_stats(run, duration_s, fields["total_output_tokens"]))
    result = ServeResult(failed=sum(reasons.values()), failed_reasons=reasons, percentiles=pcts, **fields)
    return result, table


def vllm_result(table: RequestTable, token_time_s: np.ndarray, token_request_id: np.ndarray, result: ServeResult,
                header: dict) -> dict:
    """The run as `vllm bench serve --save-result` writes it: one flat JSON object, its header (date, backend,
    model_id, num_prompts, request_rate, burstiness, max_concurrency), the metrics under vLLM's keys and the
    per-request lists in seconds (vllm/benchmarks/serve.py `benchmark`'s result dict: input_lens, output_lens, ttfts,
    itls, latencies, start_times, errors; a rejected request has output_len 0, ttft 0 and its reason as error)."""
    n = len(table.request_id)
    ok = table.completed
    gaps: list[list[float]] = [[] for _ in range(n)]
    if len(token_time_s):
        bounds = np.flatnonzero(np.diff(token_request_id)) + 1
        for ids, times in zip(np.split(token_request_id, bounds), np.split(token_time_s, bounds)):
            gaps[int(ids[0])] = np.diff(times).tolist()
    flat = result.flat()
    out = {**header, "duration": result.duration_s, **{k: v for k, v in flat.items() if k != "duration_s"},
           "input_lens": table.input_tokens.tolist(),
           "output_lens": np.where(ok, table.output_tokens, 0).tolist(),
           "ttfts": np.where(ok, table.ttft_ms / MS_PER_S, 0.0).tolist(),
           "itls": gaps,
           "latencies": np.where(ok, table.e2el_ms / MS_PER_S, 0.0).tolist(),
           "start_times": table.arrival_s.tolist(),
           "errors": ["" if done else "rejected" for done in ok.tolist()]}
    return out


CSV_COLUMNS = ("request_id", "replica", "arrival_s", "input_tokens", "output_tokens", "ttft_ms", "tpot_ms",
               "e2el_ms", "finish_s", "preemptions", "client_queue_ms")   # arrival_s: the send (after a cap's wait)


def write_requests_csv(table: RequestTable, path: str | Path) -> None:
    """One row per request; empty cells where a request has no value (rejected; TPOT with one output token)."""
    def cell(v) -> str:
        if isinstance(v, float | np.floating):
            return "" if math.isnan(v) else f"{float(v):.6f}"
        return str(v)

    try:
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            cols = [getattr(table, c) for c in CSV_COLUMNS]
            for row in zip(*(c.tolist() for c in cols)):
                w.writerow([cell(v) for v in row])
    except OSError as e:
        raise AisimError(f"cannot write per-request CSV {path}: {e.strerror}") from None
