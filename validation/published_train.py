"""The published large-scale training table (validation/references/megatron_sc21.yaml) against aisim's training
study: each row's GPT model (a GPT-2-architecture HF config built from the row), TP x PP x DP on a100x8-hdr
nodes, fp16 mixed precision, full recompute, micro-batch 1 and 1F1B (the table does not state them). Achieved
teraFLOP/s per GPU = the paper's eq. 3 FLOPs / (estimated iteration time x GPUs). No parameter is fitted to it.

    python -m aisim.validation.published_train
"""
from __future__ import annotations

from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "references" / "megatron_sc21.yaml"
MICRO_BATCH = 1           # not stated in Table 1 (assumption of the comparison)
THROUGHPUT_GOAL_PCT = 10.0
# regression ceiling: the value when set plus half a point. 2026-11-26: 8.1 %; 2026-11-27: 9.3 %, a stated
# regression: Megatron-LM fuses its attention mask into the softmax kernel (FusedScaleMaskSoftmax), while the
# explicit-attention path prices HF's separate (B, 1, S, S) mask add, since then at the outer-broadcast rate
# PyTorch runs it at (cost/ops_time.py outer_broadcast); a scale-mask-softmax fusion for attention="explicit" is
# the fix, not made.
THROUGHPUT_CEILING_PCT = 9.8


def load() -> dict:
    import yaml

    return yaml.safe_load(REFERENCE.read_text())


def gpt_config(row: dict, seq: int, vocab: int) -> dict:
    """An HF GPT-2 config of the row's model (Megatron GPT: learned positions, LayerNorm, GeLU, 4h MLP)."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": row["hidden"],
            "n_head": row["heads"], "n_layer": row["layers"], "n_positions": seq, "n_ctx": seq, "vocab_size": vocab,
            "activation_function": "gelu_new", "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "_name_or_path": f"gpt-{row['params_b']}b"}


def _config_path(config: dict) -> Path:
    """The config written where aisim reads model configs from a path (a temporary folder)."""
    import json
    import tempfile

    folder = Path(tempfile.gettempdir()) / "aisim-megatron-sc21" / config["_name_or_path"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def paper_flops(row: dict, seq: int, vocab: int) -> float:
    """Eq. 3 of the paper: 96 B s l h^2 (1 + s / 6h + V / 16 l h) per iteration (recompute included)."""
    b, h, layers = row["batch"], row["hidden"], row["layers"]
    return 96 * b * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))


def estimate_row(row: dict, seq: int, vocab: int):
    from aisim.scenario import scenario
    from aisim.studies.train import TrainRequest, multi_node_device, train
    from aisim.workload import TrainPlan

    dp = row["gpus"] // (row["tp"] * row["pp"])
    device = multi_node_device("a100x8-hdr", row["gpus"] // 8)
    sc = scenario(_config_path(gpt_config(row, seq, vocab)), device, dtype="fp16", tp=row["tp"], pp=row["pp"], dp=dp,
                  batch=row["batch"], phase="train")
    # as Megatron-LM 2021 ran: explicit attention (no FlashAttention then; its scale-mask-softmax fused), full
    # recompute, fp16 compute, the vocab-parallel embedding, head and cross entropy (training's tp scope)
    plan = TrainPlan(precision="16-true", recompute="full", micro_batch=MICRO_BATCH, attention="explicit")
    return train(sc, TrainRequest(batch=row["batch"], seq=seq, plan=plan))


def rows() -> list[dict]:
    ref = load()
    seq, vocab = ref["seq"], ref["vocab"]
    out = []
    for row in ref["rows"]:
        est = estimate_row(row, seq, vocab)
        tflops = paper_flops(row, seq, vocab) / (est.step_ms / 1e3) / row["gpus"] / 1e12 if est.fits else None
        out.append({**row, "fits": est.fits, "estimated_tflops_per_gpu": tflops, "step_ms": est.step_ms,
                    "memory_gb": est.memory.total_gb, "bubble_ms": est.phases.get("bubble_ms"),
                    "exposed_comm_ms": est.phases.get("exposed_comm_ms"),
                    "err_pct": None if tflops is None else 100 * (tflops - row["tflops_per_gpu"]) / row["tflops_per_gpu"]})
    return out


def throughput_mape(table: list[dict]) -> float:
    errs = [abs(r["err_pct"]) for r in table if r["err_pct"] is not None]
    return sum(errs) / len(errs) if errs else float("nan")


def published_section() -> list[str]:
    table = rows()
    errs = [r["err_pct"] for r in table if r["err_pct"] is not None]
    lines = ["## Published large-scale training: Narayanan et al. 2021 (SC21) Table 1", "",
             "GPT 1.7B-1T on 32-3072 A100 80GB (Selene; aisim a100x8-hdr nodes), fp16 mixed, full recompute; "
             f"micro-batch {MICRO_BATCH} and 1F1B assumed (not in the table). Achieved TFLOP/s per GPU from the "
             "paper's eq. 3 over the estimated iteration time.", "",
             "| params (B) | TP | PP | DP | GPUs | batch | published TFLOP/s | estimated | error | step (s) | "
             "bubble (s) | exposed comm (s) | memory GB |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        dp = r["gpus"] // (r["tp"] * r["pp"])
        est = "does not fit" if not r["fits"] else f"{r['estimated_tflops_per_gpu']:.0f}"
        err = "-" if r["err_pct"] is None else f"{r['err_pct']:+.1f}%"
        step = "-" if r["step_ms"] is None else f"{r['step_ms'] / 1e3:.2f}"
        bub = "-" if r["bubble_ms"] is None else f"{r['bubble_ms'] / 1e3:.2f}"
        com = "-" if r["exposed_comm_ms"] is None else f"{r['exposed_comm_ms'] / 1e3:.2f}"
        lines.append(f"| {r['params_b']} | {r['tp']} | {r['pp']} | {dp} | {r['gpus']} | {r['batch']} | "
                     f"{r['tflops_per_gpu']} | {est} | {err} | {step} | {bub} | {com} | {r['memory_gb']:.1f} |")
    mape = sum(abs(e) for e in errs) / len(errs) if errs else float("nan")
    lines += ["", f"Per-GPU throughput MAPE {mape:.1f}% over {len(errs)} rows (goal <= {THROUGHPUT_GOAL_PCT:g}%).", ""]
    return lines


if __name__ == "__main__":
    print("\n".join(published_section()))
