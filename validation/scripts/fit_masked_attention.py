"""Masked-SDPA efficiency table for a calibration file, from the sdpa_mask microbenchmark
(validation/harness/sdpa_mask.py: PyTorch SDPA with an explicit [1, 1, Q, K] bf16 mask, 32 heads of 128).
efficiency = roofline time (max(FLOPs / datasheet peak, bytes / datasheet bandwidth)) / measured median time,
on the measured Q x K grid (the kernel transformers' paged|sdpa runs: aisim.studies.serve.timer).

    python -m aisim.validation.scripts.fit_masked_attention DATA.jsonl GPU   (prints the YAML block)
"""
from __future__ import annotations

import json
import sys

from . import run_main


def table(path: str, gpu_name: str) -> dict:
    from aisim.catalog import resolve_gpu

    gpu = resolve_gpu(gpu_name)
    rows = [json.loads(x) for x in open(path) if '"case"' in x]
    ok = {(r["q"], r["k"]): r for r in rows if r["status"] == "ok"}
    qs, ks = sorted({q for q, _ in ok}), sorted({k for _, k in ok})
    peak, bw = gpu.peak_for("bf16"), gpu.memory_bw_bytes_per_s

    def eff(q: int, k: int) -> float:
        r = ok.get((q, k)) or ok[max((p for p in ok if p[0] == q), key=lambda p: p[1])]   # missing: nearest K
        return round(max(r["flops"] / peak, r["bytes"] / bw) / (r["median_ms"] / 1e3), 4)

    return {"q": qs, "k": ks, "heads": rows[0]["heads"], "efficiency": [[eff(q, k) for k in ks] for q in qs]}


def main() -> int:
    import yaml

    if len(sys.argv) != 3:
        raise ValueError("give the data file and a GPU: python -m aisim.validation.scripts.fit_masked_attention "
                         "DATA.jsonl GPU")
    print(yaml.safe_dump({"masked_attention_table": table(sys.argv[1], sys.argv[2])}, default_flow_style=None,
                         width=120))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
