"""Mixture-of-experts accuracy: the committed MoE measurements (validation/data/moe/moe-h100.jsonl) against aisim.

``moe_section()`` returns the markdown lines of docs/accuracy.md's MoE section (validation/accuracy.py calls it);
``compare_moe()`` the per-case rows; ``moe_mape()`` MAPE per category, which tests/test_moe.py holds under ceilings.

Cases: HF transformers 5.17 eager with its default experts path (``experts_implementation="grouped_mm"``), bf16,
one H100 SXM, random weights (near-uniform routing). The per-expert Python loop (``impl=eager``) rows are listed
but not scored: its data-dependent loop over the hit experts cannot be traced on the meta device (aisim traces the
default grouped-GEMM path). Nothing here is fitted to these rows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data" / "moe" / "moe-h100.jsonl"
CONFIGS = Path(__file__).parent / "harness" / "configs"
DEVICE = "h100"
RUNTIME = "eager"
SCORED_IMPL = "grouped_mm"
CATEGORIES = ("prefill runtime", "decode runtime", "prefill memory", "decode memory")
# Goals of the engines + MoE issue (MAPE %), and regression ceilings (the value of the commit that set it plus half a
# point; tests/test_moe.py fails above them). Lower a ceiling when accuracy improves.
GOALS = {"prefill runtime": 15.0, "decode runtime": 15.0, "prefill memory": 3.0, "decode memory": 3.0}
CEILINGS = {"prefill runtime": 20.5, "decode runtime": 21.1, "prefill memory": 0.5, "decode memory": 0.6}
GB = 1e9


@dataclass(frozen=True)
class MoeRow:
    model: str
    impl: str
    workload: str
    batch: int
    context: int
    measured_ms: float
    estimated_ms: float
    measured_gb: float
    estimated_gb: float
    measured_distinct: float
    estimated_distinct: float

    @property
    def time_err_pct(self) -> float:
        return 100.0 * (self.estimated_ms - self.measured_ms) / self.measured_ms

    @property
    def mem_err_pct(self) -> float:
        return 100.0 * (self.estimated_gb - self.measured_gb) / self.measured_gb


def load_cases(path: Path = DATA) -> list[dict]:
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("type") == "case" and r.get("status") == "ok"]


def estimate_case(case: dict) -> tuple[float, float, float]:
    """(runtime ms, peak memory GB, expected distinct experts per layer) of one measured case."""
    from aisim.formulas import expected_distinct_experts
    from aisim.graph.engine import moe_routing
    from aisim.scenario import scenario
    from aisim.step import step_cost
    from aisim.workload import StepShape

    sc = scenario(str(CONFIGS / f"{case['model']}.json"), DEVICE, dtype="bf16", runtime=RUNTIME)
    cost = step_cost(sc, StepShape(phase=case["workload"], batch=case["batch"], seq=case["context"]))
    moe = moe_routing(sc.config)
    tokens = case["batch"] * (case["context"] if case["workload"] == "prefill" else 1)
    distinct = expected_distinct_experts(tokens, moe["top_k"], moe["experts"])
    return cost.runtime_s * 1e3, cost.memory.total_gb, distinct


def compare_moe(path: Path = DATA) -> list[MoeRow]:
    rows = []
    for case in load_cases(path):
        if case["impl"] != SCORED_IMPL:
            continue
        ms, gb, distinct = estimate_case(case)
        rows.append(MoeRow(case["model"], case["impl"], case["workload"], case["batch"], case["context"],
                           case["median_ms"], ms, case["peak_allocated_gb"], gb,
                           case["routing"]["mean_distinct"], distinct))
    return rows


def moe_mape(rows: list[MoeRow]) -> dict[str, float]:
    out = {}
    for phase in ("prefill", "decode"):
        sel = [r for r in rows if r.workload == phase]
        if sel:
            out[f"{phase} runtime"] = sum(abs(r.time_err_pct) for r in sel) / len(sel)
            out[f"{phase} memory"] = sum(abs(r.mem_err_pct) for r in sel) / len(sel)
    return out


def moe_section(path: Path = DATA) -> list[str]:
    """Markdown lines: the MoE dataset against estimates, per case and MAPE per category."""
    rows = compare_moe(path)
    mape = moe_mape(rows)
    skipped = [c for c in load_cases(path) if c["impl"] != SCORED_IMPL]
    lines = [
        "## Mixture-of-experts models (one H100 SXM, HF eager, grouped-GEMM experts)",
        "",
        "Measured by validation/harness/moe_bench.py (H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130, "
        "transformers 5.17.0, 2026-11-26; configs in validation/harness/configs/; random bf16 weights, so routing is "
        "near uniform). aisim reads, per grouped expert GEMM, the weights of the E * (1 - (1 - k/E)^T) experts that T "
        "tokens with top-k of E are expected to touch. Median step time; peak = torch.cuda.max_memory_allocated. "
        "Nothing is fitted to these rows.",
        "",
        "| category | cases | MAPE (%) | goal (%) | met | ceiling (%) |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for cat in CATEGORIES:
        n = sum(1 for r in rows if r.workload == cat.split()[0])
        if cat in mape:
            met = "yes" if mape[cat] <= GOALS[cat] else "no"
            lines.append(f"| {cat} | {n} | {mape[cat]:.1f} | {GOALS[cat]:.0f} | {met} | {CEILINGS[cat]:.1f} |")
    lines += ["", "| model | phase | batch | context | measured ms | estimated ms | error % | measured GB | "
              "estimated GB | error % | experts touched (measured / expected) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.workload} | {r.batch} | {r.context} | {r.measured_ms:.2f} | "
                     f"{r.estimated_ms:.2f} | {r.time_err_pct:+.1f} | {r.measured_gb:.2f} | {r.estimated_gb:.2f} | "
                     f"{r.mem_err_pct:+.1f} | {r.measured_distinct:.1f} / {r.estimated_distinct:.1f} |")
    lines += ["", f"Not scored: {len(skipped)} rows of the per-expert Python loop (`experts_implementation="
              "\"eager\"`), whose loop over the hit experts is data-dependent and is not traced on the meta device. "
              "Prefill of one sequence with random weights touches fewer experts than uniform routing predicts "
              "(26-40 of 60-128 measured at batch 1): the tokens' hidden states are alike; at prefill the experts' "
              "weights are a small part of the bytes moved, so the runtime is barely affected.", "",
              "Where the runtime goal is missed: the large prefills (8-32 x 1024 tokens) are GPU-bound and estimated "
              "17-28% short. aisim costs the compute-bound grouped GEMM at the efficiency of one expert's dense cuBLAS "
              "GEMM of the same shape, and the router's broadcast masked fills and multiplies on the contiguous "
              "memory curve; torch's CUTLASS grouped GEMM and those non-vectorised broadcast kernels are slower "
              "(the committed profile, validation/data/profiles/moe-h100-profile.txt, shows the masked fill at about "
              "half the copy bandwidth). Small steps are host-bound: OLMoE's within 8%, but Qwen1.5-MoE's and "
              "Qwen3-MoE's 20-33% short (their measured host time per layer is 1.6 ms against OLMoE's 1.2 ms; the "
              "eager dispatch model, calibrated on dense models, does not see it). No grouped-GEMM microbenchmark is "
              "committed to calibrate either, and none was fitted to these rows.", ""]
    return lines


ENGINE_CASE = {"model": "Meta-Llama-3-8B", "device": "h100", "workload": "decode", "batch": 32, "seq": 7512,
               "dtype": "bf16"}


GRAPHS_DATA = Path(__file__).parent / "data" / "kernels" / "graphs-decode-h100.jsonl"
GRAPHS_CONFIGS = {"qwen2.5-1.5b": str(CONFIGS / "qwen2.5-1.5b.json"), "Meta-Llama-3-8B": "Meta-Llama-3-8B"}


def graphs_lines(path: Path = GRAPHS_DATA) -> list[str]:
    """The measured static-cache + torch.compile decode steps (harness graphs_decode, H100) against --runtime
    graphs at the static cache's length (attention spans max_cache_len)."""
    from aisim.api import estimate

    if not path.exists():
        return ["No measured static-cache + torch.compile data."]
    rows = [r for r in map(json.loads, open(path)) if r.get("type") == "case" and r.get("mode") == "compile"
            and r.get("status") == "ok" and r["model"] in GRAPHS_CONFIGS]
    out = ["HF static cache + torch.compile(mode='reduce-overhead') decode on one H100 "
           "(validation/data/kernels/graphs-decode-h100.jsonl) against `--runtime graphs`:", "",
           "| model | batch | max_cache_len | measured ms | estimated ms | error % |", "|---|---:|---:|---:|---:|---:|"]
    errs = []
    for r in rows:
        est = estimate(GRAPHS_CONFIGS[r["model"]], "h100", workload="decode", batch=r["batch"],
                       seq=r["max_cache_len"], dtype="bf16", runtime="graphs", top_ops=0)
        err = 100 * (est.runtime_ms - r["median_ms"]) / r["median_ms"]
        errs.append(abs(err))
        out.append(f"| {r['model']} | {r['batch']} | {r['max_cache_len']} | {r['median_ms']:.2f} | "
                   f"{est.runtime_ms:.2f} | {err:+.1f} |")
    if errs:
        out += ["", f"MAPE {sum(errs) / len(errs):.1f}% over {len(errs)} cases (goal 10%: not met). aisim's graphs "
                "profile is a vLLM-like floor; the measured compiled steps are 1.4-4x slower (the static cache's "
                "masked SDPA over max_cache_len, and what Inductor leaves unfused, not yet modelled)."]
    return out


def engines_section() -> list[str]:
    """Markdown lines for the engine profiles: no measured graphs/vLLM data yet, and the decode op table of each
    runtime for the issue's case (no whole-cache copy under vllm or graphs)."""
    from aisim.api import estimate

    lines = ["## Engine profiles (vllm, graphs)", "", *graphs_lines(), "",
             "No vLLM run was made. Op tables of "
             f"{ENGINE_CASE['model']} decode, batch {ENGINE_CASE['batch']} at context {ENGINE_CASE['seq']}, bf16, "
             "one H100:", ""]
    for runtime in ("eager", "graphs", "vllm"):
        est = estimate(**ENGINE_CASE, runtime=runtime, top_ops=8)
        lines += [f"**{runtime}**: {est.runtime_ms:.2f} ms per step", "", "| op | count | GB moved | ms | % of step |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {r.name} | {r.count} | {r.bytes / GB:.2f} | {r.time_ms:.3f} | {100 * r.share:.1f} |"
                  for r in est.top_ops]
        lines.append("")
    return lines


if __name__ == "__main__":
    print("\n".join(moe_section() + engines_section()))
