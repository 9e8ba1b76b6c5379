"""Host-side overhead of eager HF transformers code, measured on tiny models that no accuracy table uses.

A forward of a 4-layer, width-64 model does almost no GPU work, so its wall time is the CPU cost of the Python
model code, the dispatcher and the kernel launches. aisim's tracer counts the same run's kernel ops, view ops
and module calls; the ratio of measured time to the time the microbenchmark dispatch costs predict
(``eager_kernel_dispatch_s`` etc.) is ``eager_framework_scale``: the Python between the ops that tight
single-op loops do not see. The models are synthetic (families llama, opt, gpt2, bloom at width 64), never the
validation suites' models, so nothing is fitted to the rows that judge accuracy.
"""
from __future__ import annotations

import statistics
import time

TINY = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 256},
    "opt": {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 64, "ffn_dim": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 1000, "word_embed_proj_dim": 64,
            "max_position_embeddings": 256},
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 4, "n_head": 4,
             "vocab_size": 1000, "n_positions": 256, "bos_token_id": 0, "eos_token_id": 0},
    "bloom": {"model_type": "bloom", "architectures": ["BloomForCausalLM"], "hidden_size": 64, "n_layer": 4,
              "n_head": 4, "vocab_size": 1000},
}
BATCH, SEQ = 1, 8


def op_counts(config: dict) -> dict[str, float]:
    """Kernel ops, view ops, Python-level calls and module calls of one traced forward (aisim's tracer)."""
    from aisim.formulas import op_cost
    from aisim.graph.extract import trace_workload
    from aisim.workload import ParallelPlan, Workload

    graph = trace_workload(config, Workload(phase="forward", batch=BATCH, seq=SEQ, dtype="fp16"), ParallelPlan(),
                           use_cache=False)
    counts = {"kernels": 0.0, "views": 0.0, "py_calls": 0.0, "modules": 0.0}
    for op, r in zip(graph.ops, graph.repeats):
        cost = op_cost(op)
        if cost.kind == "module":
            counts["modules"] += r
        elif cost.launches:
            counts["kernels"] += r * cost.launches
        else:
            counts["views"] += r
        counts["py_calls"] += r * op.attrs.get("py_calls", 0)
    return counts


def bench_framework_overhead(repeats: int = 5, calls: int = 50, device: str = "cuda") -> list[dict]:
    """Wall time per forward call of each tiny model (median of ``repeats`` loops of ``calls``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from aisim.graph.build import make_config, model_class

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = torch.float16 if device == "cuda" else torch.float32
    records = []
    for family, config in TINY.items():
        attn = "sdpa" if getattr(model_class(config), "_supports_sdpa", False) else "eager"
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(make_config(config), dtype=dtype, attn_implementation=attn,
                                                         trust_remote_code=False)
        model.eval()
        ids = torch.randint(0, 1000, (BATCH, SEQ), device=device)
        samples = []
        with torch.inference_mode():
            for _ in range(5):
                model(input_ids=ids, use_cache=False)
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    model(input_ids=ids, use_cache=False)
                sync()
                samples.append((time.perf_counter() - t0) / calls)
        records.append({"bench": "framework", "family": family, "config": config, "time_s": statistics.median(samples),
                        "samples_s": samples, "counts": op_counts(config)})
        del model
    return records


def fit_framework_scale(records: list[dict], kernel_s: float, view_s: float, module_s: float) -> float | None:
    """Median over the tiny models of measured time / (kernels K + views V + modules M)."""
    ratios = []
    for r in records:
        if r.get("bench") != "framework":
            continue
        c = r["counts"]
        predicted = c["kernels"] * kernel_s + c["views"] * view_s + c["modules"] * module_s
        if predicted > 0:
            ratios.append(r["time_s"] / predicted)
    return statistics.median(ratios) if ratios else None
