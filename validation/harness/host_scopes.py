"""Where an eager decode step's host time goes: per module scope and per aten op, dense and MoE models, one GPU.

    python3 -m aisim.validation.harness.host_scopes --out OUT/host_scopes.jsonl [--models ...] [--smoke]

A diagnostic, not a validation dataset: the step times it records are not scored. For each model (random bf16
weights, HF eager, DynamicCache decode as validation/harness/moe_bench.py runs it: one token per row over a cache
holding ctx-1 tokens, ``cache.crop(-1)`` untimed after every step):

1. ``clean``: the step timed with CUDA events (median), and the host's launch time of the step (perf_counter from
   the call to its return, no sync; equal to the step where the host is the bottleneck).
2. ``scopes``: forward pre/post hooks on every decoder layer and on each of its direct children (input_layernorm,
   self_attn, post_attention_layernorm, mlp, ...); host milliseconds per step per child name summed over layers, the
   layers' total, and the step's remainder (embedding, rotary, masks, final norm, head). The hooks cost the host a
   few microseconds each; the hooked step's total is recorded beside the clean one.
3. ``ops``: torch.profiler with CPU activities only (no CUPTI, which leaves the process slower: pytorch#144455), one
   window per step (the cache cleanup between steps outside it; the 2026-11-26 data's single window held it too:
   2 copies per layer, which validation/moe_report.py subtracts): per aten op name, calls and self CPU microseconds
   per step.
4. ``clean`` again after the profile (the profiler's residue, if any).

Before all of that, a first pass times every model's ``clean`` step (type ``clean_first`` records) before any
profiler session has run in the process: a CPU-only profile leaves the process slower too (OLMoE 22.0 -> 25.2 ms
per decode step right after its own profile, validation/data/kernels/host-scopes-h100-run2.jsonl), so in the
second pass every model after the first is timed with the earlier models' residue. ``--no-clean-first`` skips it.

validation/moe_report.py (host_scopes_rows) sets the launches and host time against aisim's for the same step.
"""
from __future__ import annotations

import re
import statistics
import time
from collections import defaultdict

from . import common
from .moe_bench import prepare

SCRIPT = "host_scopes"
DEFAULT_MODELS = "olmoe-1b-7b,qwen1.5-moe-a2.7b,qwen3-30b-a3b:12,Meta-Llama-3-8B"
LAYER = re.compile(r"^(.*\.layers\.)(\d+)(\.([A-Za-z_]+))?$")


class ScopeTimer:
    """Host seconds spent inside each decoder layer's direct children (by child name) and inside the layers."""

    def __init__(self, model):
        self.totals: dict[str, float] = defaultdict(float)
        self.handles = []
        self._open: dict[int, float] = {}
        for name, module in model.named_modules():
            m = LAYER.match(name)
            if not m:
                continue
            key = m.group(4) or "layer"
            self.handles.append(module.register_forward_pre_hook(self._pre(id(module))))
            self.handles.append(module.register_forward_hook(self._post(id(module), key)))

    def _pre(self, ident):
        def hook(module, args):
            self._open[ident] = time.perf_counter()
        return hook

    def _post(self, ident, key):
        def hook(module, args, output):
            self.totals[key] += time.perf_counter() - self._open.pop(ident)
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def launch_ms(step, after, device, n: int) -> list[float]:
    """Host milliseconds from the call of ``step`` to its return (no sync inside), each step then drained."""
    out = []
    for _ in range(n):
        common.sync(device)
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e3)
        common.sync(device)
        after()
    return out


def clean(step, after, device, args) -> dict:
    times = common.time_steps(step, device, warmup=args.warmup, min_trials=args.trials, max_trials=args.trials,
                              min_time_s=0.0, after=after)
    launch = launch_ms(step, after, device, args.trials)
    return {"median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4),
            "max_ms": round(max(times), 4), "launch_median_ms": round(statistics.median(launch), 4),
            "trials": len(times)}


def scopes(model, step, after, device, args) -> dict:
    timer = ScopeTimer(model)
    try:
        launch_ms(step, after, device, 2)
        timer.totals.clear()
        launch = launch_ms(step, after, device, args.trials)
    finally:
        timer.remove()
    per_step = {k: round(v * 1e3 / args.trials, 4) for k, v in sorted(timer.totals.items())}
    hooked = statistics.fmean(launch)
    return {"host_ms_per_step": per_step, "hooked_launch_mean_ms": round(hooked, 4),
            "outside_layers_ms": round(hooked - per_step.get("layer", 0.0), 4)}


def ops(step, after, device, args) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    steps = args.profile_steps
    totals: dict[str, list[float]] = {}
    for _ in range(steps):     # one profiler window per step: the cache cleanup (after) stays outside it
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
            common.sync(device)
        after()
        for e in prof.key_averages():
            t = totals.setdefault(e.key, [0.0, 0.0, 0.0])
            t[0] += e.count
            t[1] += e.self_cpu_time_total
            t[2] += e.cpu_time_total
    table = [{"name": name, "calls_per_step": round(c / steps, 3), "self_cpu_us_per_step": round(us / steps, 2),
              "cpu_total_us_per_step": round(total / steps, 2)} for name, (c, us, total) in totals.items()]
    table.sort(key=lambda r: -r["self_cpu_us_per_step"])
    return table


def parse_model(text: str) -> tuple[str, int | None]:
    name, _, layers = text.partition(":")
    return name, (int(layers) if layers else None)


def build(text: str, args, device, dtype, out):
    """The model named by ``text`` (NAME or NAME:LAYERS), or None with its error recorded."""
    name, layers = parse_model(text)
    overrides = {"num_hidden_layers": layers} if layers else {}
    try:
        model = common.build_causal_lm(common.hf_config(name, **overrides), dtype, device, seed=args.seed)
        common.sync(device)
        return model
    except Exception as exc:  # noqa: BLE001 - recorded per model
        out.write({"type": "model", "model": name, "status": common.classify_error(exc)[0],
                   "error": common.classify_error(exc)[1]})
        if common.is_fatal_device_error(exc):
            raise
        return None


def cases(model, name: str, kind: str, args, device, measure):
    """Each --cases decode case of ``model`` as a ``kind`` record: ``measure(row, step, after)`` fills it; a failed
    case is recorded (a fatal device error raised), the cache cleanup always runs."""
    for batch, context in args.cases:
        row = {"type": kind, "model": name, "num_hidden_layers": model.config.num_hidden_layers,
               "workload": "decode", "batch": batch, "context": context, "status": "ok"}
        cleanup = lambda: None  # noqa: E731
        try:
            step, after, cleanup = prepare(model, "decode", batch, context, device, args.seed)
            measure(row, step, after)
        except Exception as exc:  # noqa: BLE001 - recorded per case
            row["status"], row["error"] = common.classify_error(exc)
            if common.is_fatal_device_error(exc):
                raise
        finally:
            try:
                cleanup()
            except Exception:  # noqa: BLE001
                pass
        yield row


def clean_first(text: str, args, device, dtype, out) -> None:
    """The clean step of every case of one model, before any profiler session in this process."""
    name, _ = parse_model(text)
    model = build(text, args, device, dtype, out)
    if model is None:
        return

    def measure(row, step, after):
        row["clean"] = clean(step, after, device, args)

    for row in cases(model, name, "clean_first", args, device, measure):
        out.write(row)
        print(f"[host_scopes] clean first: {name} b{row['batch']} ctx{row['context']}: {row['status']} "
              f"launch {row.get('clean', {}).get('launch_median_ms')} ms", flush=True)
    del model
    common.free_memory()


def run_model(text: str, args, device, dtype, out) -> None:
    name, _ = parse_model(text)
    t0 = time.perf_counter()
    model = build(text, args, device, dtype, out)
    if model is None:
        return
    out.write({"type": "model", "model": name, "num_hidden_layers": model.config.num_hidden_layers,
               "attn_implementation": model.config._attn_implementation,
               "experts_implementation": getattr(model.config, "_experts_implementation", None),
               "build_s": round(time.perf_counter() - t0, 2), "status": "ok"})

    def measure(row, step, after):
        row["clean"] = clean(step, after, device, args)
        row["scopes"] = scopes(model, step, after, device, args)
        row["ops"] = ops(step, after, device, args)[: args.top_ops]
        row["clean_after"] = clean(step, after, device, args)

    for row in cases(model, name, "case", args, device, measure):
        out.write(row)
        c = row.get("clean", {})
        print(f"[host_scopes] {name} b{row['batch']} ctx{row['context']}: {row['status']} step "
              f"{c.get('median_ms')} ms, launch {c.get('launch_median_ms')} ms, scopes "
              f"{row.get('scopes', {}).get('host_ms_per_step')}", flush=True)
    model = None          # the closure above holds the name; drop the weights before freeing
    common.free_memory()


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny models on the CPU (or the GPU), seconds")
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help="comma list of config names; NAME:L builds it with L decoder layers")
    parser.add_argument("--cases", default="1:128,8:128", help="comma list of batch:context decode cases")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--top-ops", type=int, default=80)
    parser.add_argument("--no-host", action="store_true", help="skip the host microbenchmark lines")
    parser.add_argument("--no-clean-first", action="store_true",
                        help="skip the first pass that times every model before any profiler session")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    common.set_env()
    import torch

    if args.smoke:
        args.models = "tiny-olmoe,tiny-qwen2_moe"
        args.cases, args.trials, args.warmup, args.profile_steps = "2:16", 3, 1, 2
    try:
        args.cases = [(int(b), int(c)) for b, c in (x.split(":") for x in args.cases.split(",") if x)]
    except ValueError:
        parser.error(f"--cases {args.cases!r}: give batch:context pairs, e.g. 1:128,8:128")
    device = common.pick_device()
    if args.smoke:
        common.smoke_threads(device)
    if args.smoke and device.type == "cpu":
        args.dtype = "fp32"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    out, budget, measure_host = common.start_run(SCRIPT, args, device, profile_window_per_step=True)
    models = [m for m in args.models.split(",") if m]
    if not args.no_clean_first:
        for text in models:
            if not budget.allows(30):
                break
            clean_first(text, args, device, dtype, out)
    for text in models:
        if not budget.allows(30):
            print("[host_scopes] budget spent; stopping", flush=True)
            break
        run_model(text, args, device, dtype, out)
    if measure_host:
        out.write(common.host_record("end"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
