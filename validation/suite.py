"""Measurement suites: which cases to run on real hardware, loaded from YAML (``validation/suites/*.yaml``).

A suite file::

    name: h100
    settings: {warmup: 3, min_trials: 10}          # optional, see MeasureSettings
    cases:
      - {model: opt-6.7b, workload: forward, dtype: fp16, shapes: [[1, 128], [16, 1024]]}
      - {model: Meta-Llama-3-8B, workload: decode, dtype: bf16, batch: [1, 8], seq: [128, 1024]}

Each entry expands to the product of its list-valued fields (model, workload, dtype, tp, batch, seq), with
``shapes`` (a list of [batch, seq] pairs) in place of batch x seq. ``seq`` is the input length, or for
``decode`` the context length: the step attends over ``seq`` tokens (seq - 1 cached plus the new one).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

Workload = Literal["forward", "prefill", "decode", "encode", "forward-backward", "train"]
DType = Literal["fp32", "bf16", "fp16"]
TpScope = Literal["all", "mlp"]

TRAINING_WORKLOADS = ("forward-backward", "train")


class MeasureSettings(BaseModel):
    """How one case is timed. The timed window is also the energy window, so it lasts at least
    ``max(min_time_s, energy_min_s)`` where energy can be read (``min_time_s`` alone where it cannot)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    warmup: int = Field(3, ge=1, description="untimed steps before the trials")
    min_trials: int = Field(10, ge=1)
    max_trials: int = Field(2000, ge=1)
    min_time_s: float = Field(0.5, ge=0, description="the timed trials last at least this long")
    energy_min_s: float = Field(1.0, ge=0, description="the energy window (back-to-back steps) lasts at least this")
    seed: int = 0
    max_token_id: int = Field(10000, ge=2, description="input ids are drawn below min(vocab, this)")
    prefill_chunk_tokens: int = Field(16384, ge=1, description="decode: the KV cache is filled in chunks of at "
                                      "most this many tokens (batch x chunk length)")
    real_prefill_max_tokens: int = Field(65536, ge=0, description="decode: above batch x (seq-1) tokens the KV "
                                         "cache is filled with random values instead of a real prefill")


class Case(BaseModel):
    """One measured case. ``key`` identifies it across runs (reruns skip finished keys)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = Field(description="a shipped model name (aisim.catalog) or a path to an HF config.json")
    workload: Workload = "forward"
    batch: int = Field(1, ge=1)
    seq: int = Field(1024, ge=1, description="input length; for decode the context length")
    dtype: DType = "fp16"
    tp: int = Field(1, ge=1)
    tp_scope: TpScope = "all"
    ep: int = Field(1, ge=1, description="MoE experts split by index over the tp GPUs (aisim --ep; equal to tp), "
                    "instead of every expert's width")
    step_tokens: int = Field(1, ge=1, description="decode of an encoder-decoder model: new tokens per row (a "
                             "prompt call when step_tokens == seq)")
    name: str | None = None

    @model_validator(mode="after")
    def _ep_is_the_tp_group(self) -> "Case":
        if self.ep not in (1, self.tp):
            raise ValueError(f"case {self.model}: ep {self.ep} must be 1 or the tp degree ({self.tp}): the harness "
                             "splits the experts over the tensor-parallel GPUs")
        return self

    @model_validator(mode="after")
    def _decode_needs_context(self) -> "Case":
        if self.workload == "decode" and self.seq < 2:
            raise ValueError(f"decode case {self.model}: seq is the context length and must be at least 2")
        if self.step_tokens > 1 and (self.workload != "decode" or self.step_tokens > self.seq):
            raise ValueError(f"case {self.model}: step_tokens applies to decode and must not exceed seq")
        return self

    @property
    def key(self) -> str:
        """Stable identifier: ``model/workload/bB/sS/dtype/tpN`` (``/mlp`` appended for MLP-only TP)."""
        scope = ("/mlp" if self.tp_scope == "mlp" else "") + (f"/ep{self.ep}" if self.ep > 1 else "")
        step = f"/q{self.step_tokens}" if self.step_tokens != 1 else ""
        return f"{self.model}/{self.workload}/b{self.batch}/s{self.seq}{step}/{self.dtype}/tp{self.tp}{scope}"

    @property
    def tokens(self) -> int:
        """Tokens processed per step: batch x seq, batch x step_tokens for a decode step, batch for encode."""
        if self.workload == "decode":
            return self.batch * self.step_tokens
        return self.batch if self.workload == "encode" else self.batch * self.seq

    @property
    def group(self) -> tuple[str, str, int, str, int]:
        """Cases of one group share one built model: (model, dtype, tp, tp_scope, ep)."""
        return (self.model, self.dtype, self.tp, self.tp_scope if self.tp > 1 else "all", self.ep)

    @property
    def training(self) -> bool:
        return self.workload in TRAINING_WORKLOADS


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    settings: MeasureSettings = MeasureSettings()
    cases: list[Case]

    @model_validator(mode="after")
    def _unique_keys(self) -> "Suite":
        seen: set[str] = set()
        dupes = [c.key for c in self.cases if c.key in seen or seen.add(c.key)]
        if dupes:
            raise ValueError(f"suite {self.name!r}: duplicate cases {sorted(set(dupes))}")
        return self


_LISTABLE = ("model", "workload", "dtype", "tp", "batch", "seq")


def expand_entry(entry: dict) -> list[dict]:
    """One YAML entry -> case dicts: the product of its list-valued fields, ``shapes`` giving (batch, seq) pairs."""
    entry = dict(entry)
    shapes = entry.pop("shapes", None)
    if shapes is not None:
        if "batch" in entry or "seq" in entry:
            raise ValueError(f"suite entry {entry}: give either shapes or batch/seq, not both")
        pairs = [tuple(s) for s in shapes]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"suite entry {entry}: shapes must be [batch, seq] pairs, got {shapes}")
    else:
        pairs = None
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in entry.items() if k in _LISTABLE}
    fixed = {k: v for k, v in entry.items() if k not in _LISTABLE}
    names = list(axes)
    out = []
    for values in itertools.product(*(axes[n] for n in names)):
        base = {**fixed, **dict(zip(names, values))}
        for pair in pairs or [None]:
            out.append(base if pair is None else {**base, "batch": pair[0], "seq": pair[1]})
    if fixed.get("name") and len(out) > 1:
        raise ValueError(f"suite entry {entry}: 'name' is only allowed on an entry that expands to one case")
    return out


def load_suite(path: str | Path) -> Suite:
    """Read a suite YAML (compact entries expanded in file order)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"suite file {str(path)!r} does not exist (shipped suites: validation/suites/)")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict) or "cases" not in data:
        raise ValueError(f"{path}: a suite is a mapping with 'cases' (and optional name, description, settings)")
    cases = [c for entry in data["cases"] for c in expand_entry(entry)]
    return Suite(name=data.get("name", path.stem), description=data.get("description", ""),
                 settings=data.get("settings") or {}, cases=cases)


def group_cases(cases: list[Case]) -> list[list[Case]]:
    """Group cases that share a built model, groups in order of first appearance, cases in suite order."""
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group, []).append(case)
    return list(groups.values())
