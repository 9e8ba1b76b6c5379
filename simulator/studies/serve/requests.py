"""Workloads for the serving simulation: request lengths, arrival times, and traces.

Length specs (one string each for input and output tokens):
  ``N``                a fixed length;
  ``uniform:LO:HI``    integers uniform on [LO, HI], both included;
  ``normal:MEAN:SD``   rounded, clipped to >= 1 (clipping raises the mean when SD is comparable to MEAN);
  ``lognormal:MEAN:SIGMA``  MEAN is the mean of the lengths (not of their log): mu = ln(MEAN) - SIGMA**2 / 2,
                       rounded and clipped to >= 1;
  ``sharegpt``         the ShareGPT sample of ``vllm bench serve --dataset-name sharegpt`` (see
                       :data:`SHAREGPT`).
Arrival specs: ``poisson`` (exponential gaps, mean 1/rate) or ``gamma:CV`` (gamma gaps with coefficient of
variation CV and mean 1/rate, i.e. shape 1/CV**2; vLLM's ``--burstiness`` is that shape). A rate of ``inf`` puts
every request at time 0, as ``vllm bench serve --request-rate inf``. Unlike vllm/benchmarks/serve.py
`get_request`, the gaps are not rescaled so that the last arrival lands exactly at N / rate.

Traces: CSV with a header, or JSON lines, with columns ``arrival_s,input_tokens,output_tokens``.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aisim.errors import AisimError

MAX_REQUESTS = 1_000_000   # about 3 minutes of simulation on one core (100,000: 16 s)
MAX_TOKENS = 10_000_000  # per request and direction: beyond any context window built so far
TRACE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class ClippedLogNormal:
    """Lengths ~ round(clip(LogNormal(mu, sigma), lo, hi)) with mu solved so that the clipped mean is mean_tokens.

    E[clip(X, lo, hi)] = lo P(X < lo) + hi P(X > hi) + e^(mu + s^2/2) [Phi(z_hi - s) - Phi(z_lo - s)],
    z = (ln x - mu) / s; increasing in mu, solved by bisection.
    """

    mean_tokens: float
    sigma: float
    lo: int = 1
    hi: int = MAX_TOKENS

    def mu(self) -> float:
        lo_ln, hi_ln = math.log(self.lo), math.log(self.hi)
        a, b = lo_ln - 20.0 * self.sigma - 1.0, hi_ln + 20.0 * self.sigma + 1.0
        for _ in range(200):
            mid = 0.5 * (a + b)
            if self._clipped_mean(mid) < self.mean_tokens:
                a = mid
            else:
                b = mid
        return 0.5 * (a + b)

    def _clipped_mean(self, mu: float) -> float:
        s = self.sigma
        z_lo, z_hi = (math.log(self.lo) - mu) / s, (math.log(self.hi) - mu) / s
        body = math.exp(mu + s * s / 2) * (_phi(z_hi - s) - _phi(z_lo - s))
        return self.lo * _phi(z_lo) + self.hi * (1.0 - _phi(z_hi)) + body

    def expected_tokens(self) -> float:
        return self.mean_tokens

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        x = rng.lognormal(self.mu(), self.sigma, size=n)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@dataclass(frozen=True)
class FixedLength:
    tokens: int

    def expected_tokens(self) -> float:
        return float(self.tokens)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class UniformLength:
    lo: int
    hi: int

    def expected_tokens(self) -> float:
        return (self.lo + self.hi) / 2

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.lo, self.hi + 1, size=n, dtype=np.int64)


@dataclass(frozen=True)
class NormalLength:
    mean_tokens: float
    sd_tokens: float

    def expected_tokens(self) -> float:
        """E[max(X, 1)], X ~ Normal(mean, sd) (the clip at 1; the rounding moves it by less than half a token)."""
        if self.sd_tokens == 0:
            return max(self.mean_tokens, 1.0)
        z = (1.0 - self.mean_tokens) / self.sd_tokens
        density = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        return _phi(z) + self.mean_tokens * (1.0 - _phi(z)) + self.sd_tokens * density

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        x = rng.normal(self.mean_tokens, self.sd_tokens, size=n)
        return np.clip(np.rint(x), 1, MAX_TOKENS).astype(np.int64)


# ShareGPT as `vllm bench serve --dataset-name sharegpt` samples it (ShareGPT_V3_unfiltered_cleaned_split.json,
# first human turn as prompt, first reply's token count as output, kept when 4 <= prompt <= 1024 and
# prompt + output <= 2048: vllm/benchmarks/datasets/utils.py `is_valid_sequence`). Means from the run in
# vllm-project/vllm PR #18566 (Llama-3.1-8B-Instruct tokenizer, 1000 prompts): 229,711 input and 203,068
# generated tokens -> 229.7 and 203.1 tokens per request. The vLLM paper (Kwon et al., SOSP 2023, sec. 6.1)
# reports 161.31 / 337.99 for its own ShareGPT preprocessing (OPT tokenizer). Only means are published: the
# log-normal shape and sigma = 1.0 are assumptions, and input and output are drawn independently. Each is
# clipped to [4, 1024] so that prompt + output <= 2048 holds as in the filter.
SHAREGPT = {
    "input": ClippedLogNormal(mean_tokens=229.7, sigma=1.0, lo=4, hi=1024),
    "output": ClippedLogNormal(mean_tokens=203.1, sigma=1.0, lo=4, hi=1024),
}
LengthDist = FixedLength | UniformLength | NormalLength | ClippedLogNormal


def _numbers(spec: str, parts: list[str], count: int, form: str) -> list[float]:
    if len(parts) != count:
        raise AisimError(f"length spec {spec!r} is not of the form {form}")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise AisimError(f"length spec {spec!r} has a non-number; use the form {form}") from None
    if not all(math.isfinite(v) for v in values):
        raise AisimError(f"length spec {spec!r} has a non-finite number; use the form {form}")
    return values


def _token_count(spec: str, value: float, what: str) -> int:
    if value != int(value) or not 1 <= value <= MAX_TOKENS:
        raise AisimError(f"length spec {spec!r}: {what} must be an integer in 1..{MAX_TOKENS}, got {value:g}")
    return int(value)


def parse_length(spec: str, role: str) -> LengthDist:
    """A length distribution from its spec string; role ("input" or "output") picks the built-in sharegpt side."""
    text = str(spec).strip().lower()
    kind, *parts = text.split(":")
    if kind == "sharegpt" and not parts:
        return SHAREGPT[role]
    if kind == "uniform":
        lo, hi = _numbers(spec, parts, 2, "uniform:LO:HI")
        lo_i, hi_i = _token_count(spec, lo, "LO"), _token_count(spec, hi, "HI")
        if lo_i > hi_i:
            raise AisimError(f"length spec {spec!r}: LO must be <= HI")
        return UniformLength(lo_i, hi_i)
    if kind == "normal":
        mean, sd = _numbers(spec, parts, 2, "normal:MEAN:SD")
        if not (1 <= mean <= MAX_TOKENS and 0 <= sd <= MAX_TOKENS):
            raise AisimError(f"length spec {spec!r}: MEAN must be in 1..{MAX_TOKENS} and SD in 0..{MAX_TOKENS}")
        return NormalLength(mean, sd)
    if kind == "lognormal":
        mean, sigma = _numbers(spec, parts, 2, "lognormal:MEAN:SIGMA")
        if not (1 <= mean <= MAX_TOKENS and 0 < sigma <= 5):
            raise AisimError(f"length spec {spec!r}: MEAN (the mean length) must be in 1..{MAX_TOKENS} and SIGMA "
                             "in (0, 5]")
        return ClippedLogNormal(mean, sigma)
    if not parts:
        try:
            return FixedLength(_token_count(spec, float(kind), "the length"))
        except ValueError:
            pass
    raise AisimError(f"unknown length spec {spec!r}; use N, uniform:LO:HI, normal:MEAN:SD, lognormal:MEAN:SIGMA "
                     "or sharegpt")


def parse_arrival_cv(spec: str) -> float:
    """Coefficient of variation of the inter-arrival gaps: 1 for ``poisson``, CV for ``gamma:CV``."""
    text = str(spec).strip().lower()
    if text == "poisson":
        return 1.0
    kind, _, value = text.partition(":")
    if kind == "gamma":
        try:
            cv = float(value)
        except ValueError:
            cv = float("nan")
        if 0 < cv <= 100:
            return cv
    raise AisimError(f"unknown arrival spec {spec!r}; use poisson or gamma:CV with 0 < CV <= 100")


def arrival_times_s(n: int, rate_per_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of n requests: cumulative gamma gaps with mean 1/rate and shape 1/cv**2 (cv = 1: Poisson).

    Reference: vllm/benchmarks/serve.py `get_request` (theta = 1 / (rate * burstiness), shape = burstiness).
    """
    if not rate_per_s > 0:
        raise AisimError(f"request rate must be > 0 requests/s (or inf), got {rate_per_s!r}")
    if math.isinf(rate_per_s):
        return np.zeros(n)
    if cv == 1.0:
        gaps = rng.exponential(1.0 / rate_per_s, size=n)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=n)
    return np.cumsum(gaps)


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival: arrival_s (float64), input_tokens and output_tokens (int64)."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    offset_s: float = 0.0     # a trace's first arrival in its own clock: arrivals count from it

    def __len__(self) -> int:
        return len(self.arrival_s)


def check_num_requests(n: int) -> int:
    if not 1 <= n <= MAX_REQUESTS:
        raise AisimError(f"number of requests must be in 1..{MAX_REQUESTS}, got {n}")
    return n


def synth_workload(num_requests: int, input_len: str, output_len: str, rate_per_s: float, arrival: str,
                   seed: int) -> Workload:
    """A synthetic workload. Lengths and arrivals use independent streams spawned from one seed, so changing the
    rate does not change the lengths."""
    n = check_num_requests(num_requests)
    in_dist, out_dist = parse_length(input_len, "input"), parse_length(output_len, "output")
    cv = parse_arrival_cv(arrival)
    in_rng, out_rng, arr_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    return Workload(arrival_times_s(n, rate_per_s, cv, arr_rng), in_dist.sample(n, in_rng),
                    out_dist.sample(n, out_rng))


def _trace_row(where: str, row: dict) -> tuple[float, int, int]:
    missing = [c for c in TRACE_COLUMNS if row.get(c) in (None, "")]
    if missing:
        raise AisimError(f"{where}: missing {', '.join(missing)}; each row needs {','.join(TRACE_COLUMNS)}")
    try:
        arrival = float(row["arrival_s"])
        tokens = [float(row[c]) for c in TRACE_COLUMNS[1:]]
    except (TypeError, ValueError):
        raise AisimError(f"{where}: arrival_s and token counts must be numbers, got "
                         f"{[row[c] for c in TRACE_COLUMNS]}") from None
    if not (math.isfinite(arrival) and arrival >= 0):
        raise AisimError(f"{where}: arrival_s must be a finite number of seconds >= 0, got {row['arrival_s']!r}")
    for name, value in zip(TRACE_COLUMNS[1:], tokens):
        if not (math.isfinite(value) and value == int(value) and 1 <= value <= MAX_TOKENS):
            raise AisimError(f"{where}: {name} must be an integer in 1..{MAX_TOKENS}, got {row[name]!r}")
    return arrival, int(tokens[0]), int(tokens[1])


def _csv_rows(path: Path, text: str):
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    if not set(TRACE_COLUMNS) <= {h.strip() for h in header}:
        raise AisimError(f"{path}:1: the CSV header must name {','.join(TRACE_COLUMNS)}, got {','.join(header)}")
    for row in reader:
        yield f"{path}:{reader.line_num}", {k.strip(): (v.strip() if isinstance(v, str) else v)
                                            for k, v in row.items() if k is not None}


def _jsonl_rows(path: Path, text: str):
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise AisimError(f"{path}:{number}: not a JSON object ({e.msg}); write one object per line") from None
        if not isinstance(row, dict):
            raise AisimError(f"{path}:{number}: not a JSON object; write one object per line")
        yield f"{path}:{number}", row


def read_trace(path: str | Path) -> Workload:
    """Requests from a CSV (header row) or JSONL trace with columns arrival_s,input_tokens,output_tokens.

    Rows need not be sorted; they are sorted by arrival (stably), and the times count from the first arrival
    (Workload.offset_s keeps it: a log's epoch timestamps would otherwise count the years before it as idle time).
    Every error names the file and line.
    """
    path = Path(path)
    if path.suffix.lower() not in (".csv", ".jsonl", ".json"):
        raise AisimError(f"trace {path} must end in .csv or .jsonl")
    try:
        text = path.read_text()
    except OSError as e:
        raise AisimError(f"cannot read trace {path}: {e.strerror}") from None
    rows = _csv_rows(path, text) if path.suffix.lower() == ".csv" else _jsonl_rows(path, text)
    parsed = []
    for where, row in rows:
        parsed.append(_trace_row(where, row))
        if len(parsed) > MAX_REQUESTS:
            raise AisimError(f"{where}: trace has more than {MAX_REQUESTS} requests; split it")
    if not parsed:
        raise AisimError(f"trace {path} has no requests")
    data = np.array(parsed, dtype=np.float64)
    order = np.argsort(data[:, 0], kind="stable")
    data = data[order]
    # logs carry absolute times (epoch seconds): the run's clock starts at the first arrival, as a benchmark's does
    offset = float(data[0, 0])
    return Workload(data[:, 0] - offset, data[:, 1].astype(np.int64), data[:, 2].astype(np.int64), offset)
