"""Grouped expert GEMM: the harness's --smoke run on the CPU (validation/harness/grouped_gemm.py), the derive script
that turns its table into a calibration entry (validation/scripts/derive_grouped_gemm.py), and the cost model reading
that entry (cost/ops_time.py), with synthetic numbers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from aisim_path import ensure_aisim

AISIM_INSTALLED = ensure_aisim("aisim.validation.harness")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_moe_dims_of_the_three_configs():
    from aisim.validation.harness import common, grouped_gemm

    dims = {n: grouped_gemm.moe_dims(common.config_dict(n)) for n in grouped_gemm.DEFAULT_MODELS.split(",")}
    assert dims["olmoe-1b-7b"] == {"experts": 64, "top_k": 8, "hidden": 2048, "inter": 1024, "model_type": "olmoe"}
    assert dims["qwen1.5-moe-a2.7b"]["experts"] == 60 and dims["qwen1.5-moe-a2.7b"]["inter"] == 1408
    assert dims["qwen3-30b-a3b"] == {"experts": 128, "top_k": 8, "hidden": 2048, "inter": 768,
                                     "model_type": "qwen3_moe"}


def test_grouped_gemm_smoke(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import os

    from aisim.validation.harness import grouped_gemm

    saved = dict(os.environ)
    path = tmp_path / "gg.jsonl"
    try:
        assert grouped_gemm.main(["--smoke", "--out", str(path)]) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    records = read_jsonl(path)
    assert records[0]["type"] == "header" and records[0]["script"] == "grouped_gemm"
    cases = [r for r in records if r["type"] == "case"]
    assert all(r["status"] == "ok" for r in cases), [r for r in cases if r["status"] != "ok"][:2]
    sections = {r["section"] for r in cases}
    assert sections == {"host", "layers", "model", "grid", "residue"}
    layers = [r for r in cases if r["section"] == "layers"]
    assert sorted((r["model"], r["layers"]) for r in layers)[:2] == [("tiny-olmoe", 2), ("tiny-olmoe", 4)]
    assert all(r["host_ms"] > 0 and r["median_ms"] > 0 for r in layers)
    model = [r for r in cases if r["section"] == "model"]
    ops = {r["op"] for r in model}
    assert {"grouped_gate_up", "grouped_down", "masked_fill_rows_", "masked_fill_gate_up", "mul_routing_weights",
            "gather_rows", "sort", "histc", "experts"} <= ops
    gate_up = next(r for r in model if r["op"] == "grouped_gate_up" and r["tokens"] == 8)
    # (S, H) @ (E, H, 2I): 2 * S * 2I * H
    assert gate_up["flop"] == 2 * gate_up["rows"] * 2 * gate_up["inter"] * gate_up["hidden"]
    grid = [r for r in cases if r["section"] == "grid"]
    assert len(grid) == 2 * 1 * 2 and all(r["median_ms"] > 0 for r in grid)
    assert all(r["host_ms"] > 0 for r in cases if r["section"] in ("host", "residue"))
