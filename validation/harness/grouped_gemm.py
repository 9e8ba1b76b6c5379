"""Grouped expert GEMM and the MoE routing ops of HF transformers 5.17, one op at a time; host time per MoE block.

    python3 -m aisim.validation.harness.grouped_gemm --out OUT/grouped_gemm.jsonl [--max-minutes 1.3] [--smoke]

What transformers runs per MoE layer with ``experts_implementation="grouped_mm"`` (integrations/moe.py
grouped_mm_experts_forward, lines 377-481): sort the T*k (token, slot) pairs by expert, gather the rows, histc +
cumsum for the offsets, one ``_grouped_mm`` over the whole (E, 2I, H) gate_up tensor transposed (a view:
``weight.transpose(-2, -1)``, line 368, then ``F.grouped_mm`` / ``torch._grouped_mm``, lines 332/334), three
broadcast ``masked_fill`` with an (S, 1) sentinel mask (lines 437, 445, 465), silu(gate) * up on the two halves of a
chunk (line 522), the down ``_grouped_mm``, the routing-weight multiply by an (S, 1) column (468), the inverse
permutation (472-473) and the sum over the k slots (479). This script times each of those on the GPU with the
exact calls, dtypes, layouts and offsets, and the router's softmax and top-k, in sections (each row has ``section``):

- ``host``: the transformers MoE block of each model (OlmoeSparseMoeBlock, Qwen2MoeSparseMoeBlock with its shared
  expert and sigmoid gate, Qwen3MoeSparseMoeBlock; one layer, random bf16 weights) called back to back on a decode
  input (1 and 8 tokens): host (CPU) time per call before the final synchronize, and device time per call. Runs
  first, in a process that has not run the profiler.
- ``layers``: a decode step (batch 1, context 128) of each model cut to 2 and 4 decoder layers (random bf16
  weights, moe_bench's DynamicCache setup): host time per step before the synchronize and the step's event time;
  the difference of the two depths is the time per decoder layer, against aisim's eager dispatch per layer.
- ``model``: each op above for each model's shapes (OLMoE-1B-7B E=64 k=8 H=2048 I=1024; Qwen1.5-MoE-A2.7B E=60 k=4
  I=1408; Qwen3-30B-A3B E=128 k=8 I=768) at T = --tokens, routing by top-k of random logits (near uniform, as random
  router weights give); ``experts`` is the whole grouped_mm_experts_forward for reference. Each row: shapes,
  ``bytes`` (operands read + result written, once), ``flop`` (grouped GEMMs), distinct experts touched.
- ``grid``: (runs before ``model``) grouped GEMM alone on a balanced grid (every one of --grid-experts experts gets
  m rows): m in --grid-m, N in --grid-n, K in --grid-k; weight stored (E, N, K) and passed transposed, as
  transformers does.
- ``residue``: the host section (and the deepest layers case) again after one torch.profiler session (CPU + CUDA
  activities) in this process: a check whether a profiler session slows the host's later kernel launches
  (moe_bench profiled its first model before it measured the others). Runs last.

Timing: CUDA events around a loop of calls for >= --window-ms, --windows windows, median per call. Grouped GEMMs
whose touched weights are small cycle through weight copies (> 2 x the 50 MiB L2 in all), so each call streams
its experts from HBM as distinct layers do.
"""
from __future__ import annotations

import math
import statistics
import time

from . import common

SCRIPT = "grouped_gemm"
DEFAULT_MODELS = "olmoe-1b-7b,qwen1.5-moe-a2.7b,qwen3-30b-a3b"
DEFAULT_TOKENS = "32768,8192,1024,128,32,8,1"   # largest first: a cut budget drops small ones
L2_BYTES = 50 * 2 ** 20
MAX_COPIES = 4
BLOCK_CLASSES = {"olmoe": ("olmoe.modeling_olmoe", "OlmoeSparseMoeBlock"),
                 "qwen2_moe": ("qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock"),
                 "qwen3_moe": ("qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock")}


def moe_dims(config: dict) -> dict:
    """E, k, H, I (expert width) of an HF MoE config dict (OLMoE: num_experts / intermediate_size; Qwen-MoE:
    num_experts / moe_intermediate_size)."""
    experts = config.get("num_experts") or config.get("num_local_experts")
    inter = config.get("moe_intermediate_size") or config["intermediate_size"]
    return {"experts": int(experts), "top_k": int(config["num_experts_per_tok"]), "hidden": int(config["hidden_size"]),
            "inter": int(inter), "model_type": config["model_type"]}


def grouped_mm_fn():
    """transformers' own dispatcher (integrations/moe.py _grouped_mm: F.grouped_mm, else torch._grouped_mm, else
    its fallback), or the torch call it makes."""
    try:
        from transformers.integrations.moe import _grouped_mm
        return _grouped_mm, "transformers.integrations.moe._grouped_mm"
    except ImportError:
        import torch

        fn = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
        return (lambda x, w, offs: fn(x, w, offs=offs)), fn.__name__


def timed(row: dict, calls, device, args) -> dict:
    times, host = common.time_calls(calls, device, args.window_ms, args.windows)
    median, host_median = statistics.median(times), statistics.median(host)
    row.update({"median_ms": round(median, 6), "min_ms": round(min(times), 6), "max_ms": round(max(times), 6),
                "windows": len(times), "loop_host_ms": round(host_median, 6),
                "host_bound": bool(host_median >= 0.9 * median)})
    return row


def nbytes(*tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def routing(tokens: int, experts: int, top_k: int, device, generator):
    """transformers' routing prologue for random logits: (expert_ids_g, perm, offsets, sample_weights_g, mask)."""
    import torch

    logits = torch.randn(tokens, experts, generator=generator, device=device, dtype=torch.float32)
    probs = torch.softmax(logits, dim=-1)
    weights, index = torch.topk(probs, top_k, dim=-1)
    expert_ids = index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    histc_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
    counts = torch.histc(histc_input, bins=experts, min=0, max=experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    mask = (expert_ids_g >= experts).unsqueeze(-1)
    return expert_ids, expert_ids_g, perm, offsets, weights.reshape(-1)[perm], mask, int((counts > 0).sum().item())


def weight_copies(e: int, n: int, k: int, touched: int, elem: int, device, dtype, generator, scale: float):
    """(E, N, K) expert tensors (as stored: gate_up_proj (E, 2I, H), down_proj (E, H, I)); enough copies that the
    touched experts of all of them exceed 2x L2."""
    import torch

    touched_bytes = max(touched, 1) * n * k * elem
    copies = 1 if device.type != "cuda" else max(1, min(MAX_COPIES, math.ceil(2 * L2_BYTES / touched_bytes)))
    return [torch.randn(e, n, k, generator=generator, device=device, dtype=torch.float32).mul_(scale).to(dtype)
            for _ in range(copies)]


def model_cases(name: str, dims: dict, tokens: int, device, dtype, args, grouped_mm) -> list[dict]:
    """Every op of grouped_mm_experts_forward for one model at T tokens, timed one at a time."""
    import torch

    e, k, h, inter = dims["experts"], dims["top_k"], dims["hidden"], dims["inter"]
    g = torch.Generator(device=device)
    g.manual_seed(args.seed + tokens * 31 + e)
    hidden = torch.randn(tokens, h, generator=g, device=device, dtype=torch.float32).to(dtype)
    expert_ids, expert_ids_g, perm, offsets, sample_w, mask, touched = routing(tokens, e, k, device, g)
    s = expert_ids.numel()
    elem = hidden.element_size()
    gate_up = weight_copies(e, 2 * inter, h, touched, elem, device, dtype, g, 1 / math.sqrt(h))
    down = weight_copies(e, h, inter, touched, elem, device, dtype, g, 1 / math.sqrt(inter))
    selected = hidden[perm // k]
    proj = grouped_mm(selected, gate_up[0].transpose(-2, -1), offsets)
    act = torch.nn.functional.silu(proj[:, :inter]) * proj[:, inter:]
    out = grouped_mm(act, down[0].transpose(-2, -1), offsets)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(s, device=device)
    weighted = out * sample_w.unsqueeze(-1)
    base = {"type": "case", "section": "model", "model": name, "tokens": tokens, "rows": s, "experts": e,
            "top_k": k, "hidden": h, "inter": inter, "touched": touched, "dtype": str(dtype).replace("torch.", ""),
            "status": "ok"}
    bool_elem = mask.element_size()
    probs = torch.softmax(torch.randn(tokens, e, generator=g, device=device, dtype=torch.float32), dim=-1)
    ops = {
        # (calls, bytes read + written once, flop, shapes)
        # the router (TopKRouter.forward, e.g. models/qwen3_moe/modeling_qwen3_moe.py:258-267): softmax, top-k
        "router_softmax": ([lambda: torch.softmax(probs, dim=-1)], 2 * probs.numel() * 4, 0, [[tokens, e]]),
        "router_topk": ([lambda: torch.topk(probs, k, dim=-1)], probs.numel() * 4 + tokens * k * 12, 0,
                        [[tokens, e]]),
        "sort": ([lambda: torch.sort(expert_ids)], nbytes(expert_ids) * 3, 0, [[s]]),
        "gather_rows": ([lambda: hidden[perm // k]], nbytes(perm) + 2 * s * h * elem, 0, [[tokens, h], [s]]),
        "histc": ([lambda: torch.histc(expert_ids_g.int() if device.type == "cuda" else expert_ids_g.float(),
                                       bins=e, min=0, max=e - 1)], s * 4 + e * 4, 0, [[s]]),
        "cumsum": ([lambda: torch.cumsum(offsets, dim=0, dtype=torch.int32)], e * 8, 0, [[e]]),
        "masked_fill_rows_": ([lambda: selected.masked_fill_(mask, 0.0)], 2 * s * h * elem + s * bool_elem, 0,
                              [[s, h], [s, 1]]),
        "grouped_gate_up": ([lambda w=w: grouped_mm(selected, w.transpose(-2, -1), offsets) for w in gate_up],
                            s * h * elem + touched * 2 * inter * h * elem + s * 2 * inter * elem + e * 4,
                            2 * s * 2 * inter * h, [[s, h], [e, h, 2 * inter], [e]]),
        "masked_fill_gate_up": ([lambda: proj.masked_fill(mask, 0.0)], 2 * s * 2 * inter * elem + s * bool_elem, 0,
                                [[s, 2 * inter], [s, 1]]),
        "silu_mul_halves": ([lambda: torch.nn.functional.silu(proj[:, :inter]) * proj[:, inter:]],
                            2 * s * inter * elem * 2 + s * inter * elem, 0, [[s, inter], [s, inter]]),
        "grouped_down": ([lambda w=w: grouped_mm(act, w.transpose(-2, -1), offsets) for w in down],
                         s * inter * elem + touched * h * inter * elem + s * h * elem + e * 4,
                         2 * s * h * inter, [[s, inter], [e, inter, h], [e]]),
        "masked_fill_down": ([lambda: out.masked_fill(mask, 0.0)], 2 * s * h * elem + s * bool_elem, 0,
                             [[s, h], [s, 1]]),
        "mul_routing_weights": ([lambda: out * sample_w.unsqueeze(-1)], 2 * s * h * elem + s * elem, 0,
                                [[s, h], [s, 1]]),
        "inverse_perm": ([lambda: inv_perm.__setitem__(perm, torch.arange(s, device=device))], 4 * s * 8, 0, [[s]]),
        "gather_inverse": ([lambda: weighted[inv_perm]], nbytes(inv_perm) + 2 * s * h * elem, 0, [[s, h], [s]]),
        "sum_top_k": ([lambda: weighted.view(tokens, k, h).sum(dim=1)], s * h * elem + tokens * h * elem, 0,
                      [[tokens, k, h]]),
    }
    rows = []
    for op, (calls, moved, flop, shapes) in ops.items():
        row = dict(base, op=op, bytes=int(moved), flop=int(flop), shapes=shapes, weight_copies=(
            len(calls) if op.startswith("grouped") else None))
        try:
            rows.append(timed(row, calls, device, args))
        except Exception as exc:  # noqa: BLE001 - recorded per case
            row["status"], row["error"] = common.classify_error(exc)
            rows.append(row)
    try:
        import types

        from transformers.integrations.moe import grouped_mm_experts_forward

        module = types.SimpleNamespace(num_experts=e, has_gate=True, has_bias=False, is_transposed=False,
                                       gate_up_proj=gate_up[0], down_proj=down[0],
                                       act_fn=torch.nn.functional.silu)
        module._apply_gate = lambda x: torch.nn.functional.silu(x[:, :inter]) * x[:, inter:]
        index = expert_ids.view(tokens, k)
        weights = torch.ones(tokens, k, device=device, dtype=dtype)
        row = dict(base, op="experts", bytes=None, flop=int(2 * s * 3 * inter * h), shapes=[[tokens, h]])
        rows.append(timed(row, [lambda: grouped_mm_experts_forward(module, hidden, index, weights)], device, args))
    except Exception as exc:  # noqa: BLE001
        rows.append(dict(base, op="experts", status=common.classify_error(exc)[0],
                         error=common.classify_error(exc)[1]))
    return rows


def grid_case(e: int, m: int, n: int, k: int, device, dtype, args, grouped_mm) -> dict:
    """Balanced grouped GEMM: E experts x m rows each, (E*m, K) @ (E, N, K)^T."""
    import torch

    row = {"type": "case", "section": "grid", "experts": e, "m": m, "n": n, "k": k, "rows": e * m,
           "dtype": str(dtype).replace("torch.", ""), "status": "ok"}
    try:
        g = torch.Generator(device=device)
        g.manual_seed(args.seed + m + 7 * n + 13 * k)
        x = torch.randn(e * m, k, generator=g, device=device, dtype=torch.float32).to(dtype)
        elem = x.element_size()
        ws = weight_copies(e, n, k, e, elem, device, dtype, g, 1 / math.sqrt(k))
        offsets = torch.arange(1, e + 1, device=device, dtype=torch.int32) * m
        row.update(flop=2 * e * m * n * k, bytes=e * m * k * elem + e * n * k * elem + e * m * n * elem + e * 4,
                   weight_copies=len(ws))
        timed(row, [lambda w=w, x=x: grouped_mm(x, w.transpose(-2, -1), offsets) for w in ws], device, args)
        row["tflops"] = round(row["flop"] / (row["median_ms"] / 1e3) / 1e12, 3)
        del x, ws
    except Exception as exc:  # noqa: BLE001
        row["status"], row["error"] = common.classify_error(exc)
    common.free_memory(collect=row["status"] != "ok")
    return row


def build_block(name: str, device, dtype, seed: int):
    import importlib

    import torch

    config = common.hf_config(name)
    config._experts_implementation = "grouped_mm"
    module_name, cls_name = BLOCK_CLASSES[config.model_type]
    cls = getattr(importlib.import_module(f"transformers.models.{module_name}"), cls_name)
    torch.manual_seed(seed)
    with torch.device(device):
        block = cls(config).to(dtype)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02)
    return block.eval(), config


def host_case(name: str, block, config, tokens: int, device, dtype, args, section: str) -> dict:
    """Back-to-back calls of the MoE block on (tokens, 1, H): host seconds per call before the final synchronize
    (the GPU work of a decode step is much shorter, so the host sets the pace) and device time per call."""
    import torch

    row = {"type": "case", "section": section, "model": name, "tokens": tokens, "op": "moe_block",
           "block": type(block).__name__, "experts_implementation": config._experts_implementation, "status": "ok"}
    try:
        x = torch.randn(tokens, 1, config.hidden_size, device=device, dtype=dtype)
        calls = args.host_calls
        with torch.inference_mode():
            for _ in range(5):
                block(x)
            common.sync(device)
            host, total = [], []
            for _ in range(args.windows):
                t0 = time.perf_counter()
                for _ in range(calls):
                    block(x)
                t1 = time.perf_counter()
                common.sync(device)
                t2 = time.perf_counter()
                host.append((t1 - t0) / calls * 1e3)
                total.append((t2 - t0) / calls * 1e3)
        row.update({"calls": calls, "host_ms": round(statistics.median(host), 5),
                    "host_min_ms": round(min(host), 5), "wall_ms": round(statistics.median(total), 5)})
        with torch.inference_mode():
            timed(row, [lambda: block(x)], device, args)   # device time per call (events), = wall when host-bound
    except Exception as exc:  # noqa: BLE001
        row["status"], row["error"] = common.classify_error(exc)
    return row


def host_section(names, device, dtype, args, section: str, blocks: dict) -> list[dict]:
    rows = []
    for name in names:
        if name not in blocks:
            try:
                blocks[name] = build_block(name, device, dtype, args.seed)
            except Exception as exc:  # noqa: BLE001
                rows.append({"type": "case", "section": section, "model": name, "op": "moe_block",
                             "status": common.classify_error(exc)[0], "error": common.classify_error(exc)[1]})
                continue
        block, config = blocks[name]
        for tokens in common.parse_ints(args.host_tokens):
            rows.append(host_case(name, block, config, tokens, device, dtype, args, section))
    return rows


def layers_case(name: str, layers: int, device, dtype, args) -> dict:
    """Decode step (batch 1, context --layers-context) of the model cut to ``layers`` decoder layers, as moe_bench
    times it (its prepare(): DynamicCache filled by a real prefill, cache cropped back untimed): host time of the
    step before the GPU is waited for, and the step's event time. Two depths give the time per layer."""
    from . import moe_bench

    row = {"type": "case", "section": "layers", "model": name, "layers": layers, "batch": 1,
           "context": args.layers_context, "op": "decode_step", "status": "ok"}
    model = None
    try:
        model = common.build_causal_lm(common.hf_config(name, num_hidden_layers=layers), dtype, device,
                                       seed=args.seed)
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("grouped_mm")
        row["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
        step, after, cleanup = moe_bench.prepare(model, "decode", 1, args.layers_context, device, args.seed)
        try:
            for _ in range(3):
                step()
                after()
            common.sync(device)
            host = []
            for _ in range(args.layers_trials):
                t0 = time.perf_counter()
                step()
                host.append((time.perf_counter() - t0) * 1e3)
                common.sync(device)
                after()
            times = common.time_steps(step, device, warmup=1, min_trials=args.layers_trials,
                                      max_trials=args.layers_trials, min_time_s=0.0, after=after)
            row.update({"host_ms": round(statistics.median(host), 4), "host_min_ms": round(min(host), 4),
                        "median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4),
                        "trials": len(times)})
        finally:
            cleanup()
    except Exception as exc:  # noqa: BLE001
        row["status"], row["error"] = common.classify_error(exc)
    del model
    common.free_memory()
    return row


def profile_once(blocks: dict, device, dtype) -> None:
    """One torch.profiler session (CPU + CUDA activities) over three calls of the first block, as moe_bench's
    --profile does between its models."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    block, config = next(iter(blocks.values()))
    x = torch.randn(8, 1, config.hidden_size, device=device, dtype=dtype)
    with torch.inference_mode(), profile(activities=activities) as prof:
        for _ in range(3):
            block(x)
        common.sync(device)
    prof.key_averages()


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny shapes, seconds on a CPU")
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma list of MoE config names / paths")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help="tokens per step of the model section")
    parser.add_argument("--sections", default="host,layers,model,grid,residue")
    parser.add_argument("--grid-experts", type=int, default=64)
    parser.add_argument("--grid-m", default="16,64,256,1024,4096", help="rows per expert")
    parser.add_argument("--grid-n", default="1024,2048,4096")
    parser.add_argument("--grid-k", default="1024,2048,4096")
    parser.add_argument("--host-tokens", default="1,8")
    parser.add_argument("--host-calls", type=int, default=40)
    parser.add_argument("--layers", default="2,4", help="decoder layers of the layers section's models")
    parser.add_argument("--layers-context", type=int, default=128)
    parser.add_argument("--layers-trials", type=int, default=15)
    parser.add_argument("--window-ms", type=float, default=12.0)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--residue-reserve-s", type=float, default=12.0,
                        help="seconds of the budget the model and grid sections leave to the residue section")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    if args.smoke:
        args.models = "tiny-olmoe,tiny-qwen2_moe,tiny-qwen3_moe"
        args.tokens, args.grid_experts, args.grid_m, args.grid_n, args.grid_k = "1,8", 4, "4,16", "32", "16,32"
        args.host_tokens, args.host_calls, args.window_ms, args.windows = "1", 3, 1.0, 2
        args.layers_context, args.layers_trials = 16, 2
    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    grouped_mm, api = grouped_mm_fn()
    out = common.JsonlOut(args.out)
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out.write(common.header(SCRIPT, args, grouped_mm_api=api, l2_bytes_assumed=L2_BYTES,
                            f_grouped_mm=hasattr(torch.nn.functional, "grouped_mm")))
    budget = common.Budget(args.max_minutes)
    sections = [s for s in args.sections.split(",") if s]
    names = [m for m in args.models.split(",") if m]
    rows, stopped, blocks = [], False, {}
    dims = {name: moe_dims(common.config_dict(name)) for name in names}
    reserve = args.residue_reserve_s if "residue" in sections else 0.0   # seconds kept for the last section

    def emit(new):
        for row in new:
            out.write(row)
            rows.append(row)

    try:
        if "host" in sections:
            emit(host_section(names, device, dtype, args, "host", blocks))
            if "residue" not in sections:
                blocks.clear()
                common.free_memory()
        if "layers" in sections:
            for name in names:
                for layers in common.parse_ints(args.layers):
                    if budget.expired():
                        break
                    emit([layers_case(name, layers, device, dtype, args)])
        if "grid" in sections:
            for m in common.parse_ints(args.grid_m):
                for n in common.parse_ints(args.grid_n):
                    for k in common.parse_ints(args.grid_k):
                        if not budget.allows(reserve):
                            stopped = True
                            break
                        emit([grid_case(args.grid_experts, m, n, k, device, dtype, args, grouped_mm)])
        if "model" in sections:
            for tokens in common.parse_ints(args.tokens):
                for name in names:
                    if not budget.allows(reserve):
                        stopped = True
                        break
                    emit(model_cases(name, dims[name], tokens, device, dtype, args, grouped_mm))
                    common.free_memory(collect=False)
                if stopped:
                    break
        if "residue" in sections and blocks and budget.allows(1):
            profile_once(blocks, device, dtype)
            emit(host_section(names, device, dtype, args, "residue", blocks))
            if "layers" in sections:
                blocks.clear()
                common.free_memory()
                deepest = max(common.parse_ints(args.layers))
                for name in names:
                    if budget.allows(2):
                        emit([dict(layers_case(name, deepest, device, dtype, args), section="residue")])
    except KeyboardInterrupt:
        stopped = True
    if stopped:
        out.write({"type": "stopped", "reason": "time budget or interrupt", "cases_done": len(rows)})
    common.print_table([r for r in rows if r.get("section") in ("host", "residue", "layers")],
                       ["section", "model", "tokens", "layers", "host_ms", "wall_ms", "median_ms", "status"],
                       title=f"grouped_gemm host time per MoE block on {gpu_name}")
    common.print_table([r for r in rows if r.get("op", "").startswith("grouped") or r.get("section") == "grid"],
                       ["section", "model", "op", "tokens", "m", "n", "k", "touched", "median_ms", "tflops", "status"],
                       title=f"grouped_gemm on {gpu_name} ({api})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
