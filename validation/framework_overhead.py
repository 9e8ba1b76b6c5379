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

from aisim.cost.timeline import PHASE_SCALE_KEY

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
DECODE_STEPS = 50            # decode calls timed per loop, from a cache of SEQ tokens (reset before each loop)
# workload phases whose host cost the phase benchmark measures, and the eager_phase_scale key each one sets
# (simulator/cost/timeline.py PHASE_SCALE_KEY, which also maps train to the forward-backward's scale)
PHASE_KEYS = {phase: key for phase, key in PHASE_SCALE_KEY.items() if phase in ("decode", "forward-backward")}


def op_counts(config: dict, phase: str = "forward") -> dict[str, float]:
    """Kernel ops, view ops, Python-level calls and module calls of one traced step (aisim's tracer): a forward of
    BATCH x SEQ, a decode step at context SEQ + DECODE_STEPS / 2 (the middle of the timed calls), or a
    forward-backward with the loss."""
    ops, kinds, launches, repeats = _trace_arrays(config, phase)
    counts = {"kernels": 0.0, "views": 0.0, "py_calls": 0.0, "modules": 0.0}
    for op, kind, n, r in zip(ops, kinds, launches.tolist(), repeats.tolist()):
        if kind == "module":
            counts["modules"] += r
        elif n:
            counts["kernels"] += r * n
        else:
            counts["views"] += r
        counts["py_calls"] += r * op.attrs.get("py_calls", 0)
    return counts


_TRACES: dict = {}


def _trace_arrays(config: dict, phase: str):
    """(ops, kinds, launches, repeats) of a traced step of ``config`` (op_counts' workloads), cached."""
    import json

    key = (json.dumps(config, sort_keys=True), phase)
    if key not in _TRACES:
        import numpy as np

        from aisim.formulas import op_cost
        from aisim.graph.extract import trace_workload
        from aisim.workload import ParallelPlan, Workload

        seq = SEQ + DECODE_STEPS // 2 if phase == "decode" else SEQ
        workload = Workload(phase=phase, batch=BATCH, seq=seq, dtype="fp16", with_loss=phase == "forward-backward")
        graph = trace_workload(config, workload, ParallelPlan(), use_cache=False)
        costs = [op_cost(op) for op in graph.ops]
        _TRACES[key] = (graph.ops, [c.kind for c in costs], np.array([c.launches for c in costs], dtype=float),
                        np.array(graph.repeats, dtype=float))
    return _TRACES[key]


def _tiny_model(config: dict, device: str, dtype):
    """One TINY model on ``device``, eval mode, SDPA where the architecture has it."""
    import torch
    from transformers import AutoModelForCausalLM

    from aisim.graph.build import make_config, model_class

    attn = "sdpa" if getattr(model_class(config), "_supports_sdpa", False) else "eager"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(make_config(config), dtype=dtype, attn_implementation=attn,
                                                 trust_remote_code=False)
    return model.eval()


def predicted_host_s(family: str, cal, phase: str = "forward") -> float:
    """Host time aisim's eager cost model (cost/timeline.py cpu_costs, with ``cal``'s dispatch constants and per-op
    table, no framework or phase scale) predicts for a TINY model's traced step."""
    return predicted_config_host_s(TINY[family], cal, phase)


def predicted_config_host_s(config: dict, cal, phase: str = "forward") -> float:
    """predicted_host_s of any tiny config (the depth sweep's), with the calibration's per-call host work
    (step_host_s) where it has one."""
    from aisim.cost.timeline import cpu_costs, step_host_s
    from aisim.specs import RuntimeSpec

    ops, kinds, launches, repeats = _trace_arrays(config, phase)
    bare = cal.model_copy(update={"eager_framework_scale": 1.0, "eager_phase_scale": {}})
    eager = RuntimeSpec(name="eager", description="eager", dispatch="eager", source="tiny-model prediction")
    return float((cpu_costs(ops, kinds, launches, bare, eager, phase) * repeats).sum()
                 + step_host_s(bare, eager, phase))


def fit_step_host_adds(runs: list[list[dict]], cal) -> dict[str, float]:
    """eager_step_host_adds from depth sweeps (bench_framework_depth records, one list per run): per run, family
    and phase, measured time per call = c + s x (the per-op prediction, ``cal``'s costs without per-call work)
    over the depths (fit_fixed_plus_linear: least squares of the relative error); c / (s x the run's own plain
    add) is that sweep's per-call work in plain adds. 'forward': the median over the forward and decode sweeps
    of every family and run; 'train': over the forward-backward sweeps."""
    from .calibrate_fit import fit_fixed_plus_linear

    bare = cal.model_copy(update={"eager_step_host_adds": {}})
    found: dict[str, list[float]] = {"forward": [], "train": []}
    for records in runs:
        adds = [statistics.median(r["samples_s"]) for r in records if r.get("name") == "add_out_s"]
        if not adds:
            continue
        unit = bare.model_copy(update={"eager_add_dispatch_s": adds[0]})
        sweeps: dict[tuple[str, str], list[dict]] = {}
        for r in records:
            if r.get("bench") == "framework_depth":
                sweeps.setdefault((r["family"], r["phase"]), []).append(r)
        for (family, phase), rows in sorted(sweeps.items()):
            if len({r["layers"] for r in rows}) < 3:
                continue
            predicted = [predicted_config_host_s(depth_config(family, r["layers"]), unit, phase) for r in rows]
            c, s = fit_fixed_plus_linear([r["time_s"] for r in rows], predicted)
            if s > 0:
                found["train" if phase == "forward-backward" else "forward"].append(c / (s * adds[0]))
    return {k: round(statistics.median(v), 1) for k, v in found.items() if v}


def fit_framework_scale_per_op(records: list[dict], cal) -> float | None:
    """eager_framework_scale for the per-op host table: median over the tiny models of measured time / the time
    ``cal``'s per-op costs predict for their traced forward (predicted_host_s)."""
    return _framework_scale([r for r in records if r.get("family") in TINY],
                            lambda r: predicted_host_s(r["family"], cal))


def fit_phase_scales_per_op(records: list[dict], cal) -> dict[str, float]:
    """fit_phase_scales with the per-op predicted host time of each phase's traced step."""
    return _phase_scales([r for r in records if r.get("family") in TINY],
                         lambda r: predicted_host_s(r["family"], cal, r["phase"]))


def _framework_scale(records: list[dict], predict) -> float | None:
    """Median over the framework records of measured time / ``predict(record)`` (records it predicts > 0)."""
    ratios = [r["time_s"] / p for r in records if r.get("bench") == "framework" and (p := predict(r)) > 0]
    return statistics.median(ratios) if ratios else None


def _phase_scales(records: list[dict], predict) -> dict[str, float]:
    """Per family and phase, measured / ``predict(record)`` of the framework_phase records; per phase key, the
    median over the families of that ratio over the family's forward ratio."""
    by_family: dict[str, dict[str, float]] = {}
    for r in records:
        if r.get("bench") == "framework_phase" and (p := predict(r)) > 0:
            by_family.setdefault(r["family"], {})[r["phase"]] = r["time_s"] / p
    scales = {}
    for phase, key in PHASE_KEYS.items():
        rel = [f[phase] / f["forward"] for f in by_family.values() if phase in f and "forward" in f]
        if rel:
            scales[key] = round(statistics.median(rel), 4)
    return scales


def _predicted_s(counts: dict, kernel_s: float, view_s: float, module_s: float) -> float:
    """Host time the dispatch constants predict for a traced step's op counts (op_counts)."""
    return counts["kernels"] * kernel_s + counts["views"] * view_s + counts["modules"] * module_s


def _tiny_models(device: str):
    """(family, config, model, ids, sync) for each TINY model in turn, built on ``device`` (fp16 on a GPU, fp32 on
    the CPU) with BATCH x SEQ random ids; each model is dropped before the next is built."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = torch.float16 if device == "cuda" else torch.float32
    for family, config in TINY.items():
        model = _tiny_model(config, device, dtype)
        yield family, config, model, torch.randint(0, 1000, (BATCH, SEQ), device=device), sync
        del model


def bench_framework_overhead(repeats: int = 5, calls: int = 50, device: str = "cuda") -> list[dict]:
    """Wall time per forward call of each tiny model (median of ``repeats`` loops of ``calls``)."""
    import torch

    records = []
    for family, config, model, ids, sync in _tiny_models(device):
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
        model = None   # the generator drops its own reference before building the next
    return records


def _phase_timers(model, ids, sync, backward: bool = True) -> dict:
    """Phase -> a function returning the wall time per call of DECODE_STEPS calls: a forward under inference_mode
    (as bench_framework_overhead), a decode step with HF's DynamicCache from a cache of the ids (as
    validation/measure.py's decode: model(new_ids, past_key_values=cache, use_cache=True)), and (``backward``) a
    forward-backward with the loss, grads set to None after each (as measure.py's forward-backward)."""
    import torch
    from transformers import DynamicCache

    new = ids[:, -1:]

    def forward():
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    def forward_backward():
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        for _ in range(DECODE_STEPS):
            fn()
        sync()
        return (time.perf_counter() - t0) / DECODE_STEPS

    def decode():
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            return timed(lambda: model(input_ids=new, past_key_values=cache, use_cache=True))

    timers = {"forward": lambda: timed(forward), "decode": decode}
    if backward:
        timers["forward-backward"] = lambda: timed(forward_backward)
    return timers


def _interleaved(timers: dict, repeats: int, warmup: int) -> dict[str, list[float]]:
    """Phase -> ``repeats`` samples of its timer, the phases taken in turn each round (host drift hits them alike),
    after ``warmup`` calls of each."""
    for fn in timers.values():
        for _ in range(warmup):
            fn()
    samples = {phase: [] for phase in timers}
    for _ in range(repeats):
        for phase, fn in timers.items():
            samples[phase].append(fn())
    return samples


def bench_framework_phases(repeats: int = 5, device: str = "cuda") -> list[dict]:
    """Wall time per step of each tiny model in three phases (_phase_timers), interleaved in one loop so that host
    drift hits them alike; fp16 weights, as above."""
    records = []
    for family, config, model, ids, sync in _tiny_models(device):
        timers = _phase_timers(model, ids, sync)
        for phase, vals in _interleaved(timers, repeats, warmup=1).items():
            records.append({"bench": "framework_phase", "family": family, "phase": phase,
                            "time_s": statistics.median(vals), "samples_s": vals, "counts": op_counts(config, phase)})
        model = timers = None   # free it before the next family
    return records


# Tiny mixture-of-experts models for the depth sweep: width 64, each with the expert count, top-k and routing
# flags of an architecture the MoE validation uses (OLMoE, Qwen1.5-MoE with its shared expert, Qwen3-MoE), so the
# routing code and its host work are the real ones while the GPU does almost nothing. Not the judged models.
TINY_MOE = {
    "olmoe": {"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"], "hidden_size": 64,
              "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
              "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "vocab_size": 1000,
              "max_position_embeddings": 256, "pad_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False},
    "qwen2_moe": {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64,
                  "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 128,
                  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 60,
                  "num_experts_per_tok": 4, "norm_topk_prob": False, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "vocab_size": 1000, "max_position_embeddings": 256,
                  "use_sliding_window": False, "tie_word_embeddings": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
                  "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 4,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 128,
                  "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "vocab_size": 1000, "max_position_embeddings": 256, "use_sliding_window": False,
                  "tie_word_embeddings": False},
}
DEPTHS = (1, 2, 4, 8, 16)


# The other shipped architectures, shrunk to the same width (tiny_of) from their model_specs config, for the
# per-architecture host table (harness/framework_arch.py): each keeps its model class, flags, expert count and top-k,
# so HF's Python and the routing code are the real ones. Not the judged models.
ARCH_SOURCES = {"mistral": "Mistral-7B-v0.1", "qwen2": "Qwen2.5-7B", "mixtral": "Mixtral-8x7B-v0.1",
                "deepseek_v2": "DeepSeek-V2-Lite", "deepseek_v3": "DeepSeek-V3", "gpt_oss": "gpt-oss-20b"}
# config key -> its tiny value, where the config has the key (and a value)
SHRINK = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
          "shared_expert_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 16,
          "vocab_size": 1000, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
          "v_head_dim": 16}
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id")


def tiny_of(config: dict) -> dict:
    """``config`` at width 64 and 4 layers (SHRINK), with its per-layer lists cut to 4, its first dense layers to at
    most 1, MHA kept MHA (else 2 KV heads), token ids inside the tiny vocabulary and no quantization config."""
    out = {k: v for k, v in config.items() if not k.startswith("_") and k != "quantization_config"}
    out.update({k: v for k, v in SHRINK.items() if out.get(k) is not None})
    heads = config.get("num_attention_heads")
    if config.get("num_key_value_heads"):
        out["num_key_value_heads"] = 4 if config["num_key_value_heads"] == heads else 2
    if isinstance(out.get("layer_types"), list):
        out["layer_types"] = out["layer_types"][:4]
    if out.get("first_k_dense_replace"):
        out["first_k_dense_replace"] = 1
    if isinstance(out.get("mlp_only_layers"), list):
        out["mlp_only_layers"] = [i for i in out["mlp_only_layers"] if i < 4]
    for key in TOKEN_ID_KEYS:
        if isinstance(out.get(key), int) and out[key] >= out["vocab_size"]:
            out[key] = out["vocab_size"] - 1 - TOKEN_ID_KEYS.index(key)
    return out


def tiny_architectures() -> dict[str, dict]:
    """HF model_type -> its tiny config: TINY and TINY_MOE as they are, the ARCH_SOURCES shrunk (tiny_of)."""
    import json
    from pathlib import Path

    specs = Path(__file__).resolve().parent.parent / "model_specs"
    shrunk = {t: tiny_of(json.loads((specs / f"{name}.json").read_text())) for t, name in ARCH_SOURCES.items()}
    return {**TINY, **TINY_MOE, **shrunk}


def with_layers(config: dict, layers: int) -> dict:
    """``config`` with every layer stack ``layers`` deep."""
    from aisim.graph.build import layer_keys

    return {**config, **{k: layers for k in layer_keys(config)}}


def depth_config(family: str, layers: int) -> dict:
    """The depth sweep's config of ``family`` (a TINY or TINY_MOE key) at ``layers`` layers."""
    return with_layers({**TINY, **TINY_MOE}[family], layers)


def bench_framework_depth(families=None, depths=DEPTHS, repeats: int = 5, device: str = "cuda"):
    """Per family and depth, the wall time per step of each phase of _phase_timers, interleaved (forward-backward
    for the dense families only). Yields one record per (family, depth, phase) as soon as it is measured. fp16 for
    the dense families, bf16 for the MoE ones (their default grouped-GEMM experts path needs it)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for family in families or (*TINY, *TINY_MOE):
        moe = family in TINY_MOE
        for layers in depths:
            model = _tiny_model(depth_config(family, layers), device, torch.bfloat16 if moe else torch.float16)
            impl = getattr(model.config, "_experts_implementation", None) if moe else None
            timers = _phase_timers(model, torch.randint(0, 1000, (BATCH, SEQ), device=device), sync, backward=not moe)
            for phase, vals in _interleaved(timers, repeats, warmup=2).items():
                yield {"bench": "framework_depth", "family": family, "layers": layers, "phase": phase,
                       "dtype": "bf16" if moe else "fp16", "experts_implementation": impl,
                       "time_s": statistics.median(vals), "samples_s": vals}
            model = timers = None
            sync()


def fit_phase_scales(records: list[dict], kernel_s: float, view_s: float, module_s: float) -> dict[str, float]:
    """eager_phase_scale: per phase (decode, train), the median over the tiny models of (measured / predicted host
    time of that phase's step) / (the same ratio of the forward measured in the same loop): how much more (or less)
    HF's Python between the ops costs there than in the forward that eager_framework_scale describes (the cache
    update of a decode step; autograd's graph recording and backward engine)."""
    return _phase_scales(records, lambda r: _predicted_s(r["counts"], kernel_s, view_s, module_s))


def fit_framework_scale(records: list[dict], kernel_s: float, view_s: float, module_s: float) -> float | None:
    """Median over the tiny models of measured time / (kernels K + views V + modules M)."""
    return _framework_scale(records, lambda r: _predicted_s(r["counts"], kernel_s, view_s, module_s))


def main(argv: list[str] | None = None) -> int:
    """On a CUDA machine: ``python -m aisim.validation.framework_overhead --out FILE.jsonl [--rounds 3]`` measures
    the dispatch loops and the tiny models' forward / decode / forward-backward, a JSONL line per record plus a
    ``fit`` line per round (appended: a killed run keeps its finished rounds). ``--depth`` measures the depth sweep
    instead (bench_framework_depth: a record per family, depth and phase, written as each is measured; no fit line:
    derive_op_host --step-adds reads them). ``--derive FILE.jsonl`` prints the eager_phase_scale those rounds give
    (median over rounds), for a calibration file."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--derive")
    parser.add_argument("--depth", action="store_true",
                        help="measure the depth sweep instead (bench_framework_depth, with the dispatch loops)")
    args = parser.parse_args(argv)
    if not (args.out or args.derive):
        parser.error("give --out FILE.jsonl (measure, on a CUDA machine) or --derive FILE.jsonl")
    if args.derive:
        try:
            with open(args.derive) as f:
                fits = [r for r in map(json.loads, f) if r.get("type") == "fit"]
        except (OSError, ValueError) as exc:
            raise SystemExit(f"error: --derive {args.derive}: {exc}") from None
        if not fits:
            raise SystemExit(f"{args.derive}: no fit lines")
        keys = sorted(set().union(*(f["eager_phase_scale"] for f in fits)))
        scales = {k: round(statistics.median(f["eager_phase_scale"][k] for f in fits if k in f["eager_phase_scale"]), 3)
                  for k in keys}
        print(json.dumps({"eager_phase_scale": scales, "rounds": len(fits)}))
        return 0
    from aisim.errors import AisimError
    from aisim.specs import CalibrationSpec, default_calibration

    from .calibrate import _require_cuda
    from .calibrate_bench import bench_overheads
    from .calibrate_fit import fit_overheads
    from .harness.common import header

    try:
        _require_cuda()
    except AisimError as exc:
        raise SystemExit(f"error: {exc}") from None
    with open(args.out, "a") as out:
        out.write(json.dumps(header("framework_overhead", args)) + "\n")
        if args.depth:
            for round_ in range(args.rounds):
                for r in (*bench_overheads(), *bench_framework_depth()):
                    out.write(json.dumps({"type": "record", "round": round_, **r}) + "\n")
                    out.flush()
                    if r.get("bench") == "framework_depth":
                        print(round_, r["family"], r["layers"], r["phase"], f"{r['time_s'] * 1e6:.0f} us", flush=True)
            return 0
        for round_ in range(args.rounds):
            raw = bench_overheads() + bench_framework_overhead() + bench_framework_phases()
            fitted = fit_overheads(raw, default_calibration())
            if fitted.get("eager_add_dispatch_s") is not None:   # the per-op host table (default.yaml's ratios)
                cal = default_calibration().model_copy(update={k: v for k, v in fitted.items()
                                                               if k in CalibrationSpec.model_fields})
                phase = fit_phase_scales_per_op(raw, cal)
            else:
                phase = fit_phase_scales(raw, fitted["eager_kernel_dispatch_s"], fitted["eager_view_dispatch_s"],
                                         fitted["module_overhead_s"])
            for r in raw:
                out.write(json.dumps({"type": "record", "round": round_, **{k: v for k, v in r.items()
                                                                             if k != "config"}}) + "\n")
            out.write(json.dumps({"type": "fit", "round": round_, **fitted, "eager_phase_scale": phase}) + "\n")
            out.flush()
            print(f"round {round_}: framework scale {fitted.get('eager_framework_scale')}, phase scales {phase}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
