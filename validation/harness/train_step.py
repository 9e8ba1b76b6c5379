"""Training steps of Llama-style models: 1 GPU plain, 2 GPUs DDP / FSDP2; bf16-mixed and bf16-true; checkpointing.

    python3 -m aisim.validation.harness.train_step --suite --gpus 2 --out OUT/train.jsonl [--max-minutes 6.5]
    python3 -m aisim.validation.harness.train_step --model llama-1b --precision bf16-mixed --batch 4 --seq 2048 \
        --strategy fsdp2 --gpus 2 --out OUT/train.jsonl
    python3 -m aisim.validation.harness.train_step --smoke --out /tmp/train.jsonl      (CPU: plain, DDP, FSDP2 on gloo)

Models: harness/configs/llama-1b.json and llama-3b.json (Llama-3.2-1B / 3B values, sources in the files;
--suite-moe: the MoE configs there), random weights built directly on the GPU, sdpa attention, ``model.train()``.
One step = ``model(input_ids, labels=input_ids, use_cache=False).loss`` (HF's loss over the full logits) +
``backward()`` + ``optimizer.step()`` +
``zero_grad(set_to_none=True)``; batch x seq are per GPU, random token ids (different per rank).

- precision ``bf16-mixed``: fp32 weights, grads and AdamW states; plain / DDP compute under
  ``torch.autocast("cuda", torch.bfloat16)``; FSDP2 uses ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`` (no autocast: FSDP2 casts the sharded fp32 params to bf16 for compute)
- precision ``bf16-true``: bf16 weights, grads and AdamW states (no autocast, no fp32 master copy)
- activation checkpointing: ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant":
  False})`` (every decoder layer)
- optimizer: ``torch.optim.AdamW(lr=1e-5, fused=True)``; if building or stepping the fused one fails, foreach
  (recorded as ``optimizer_impl``)
- strategies: ``plain`` (1 GPU); ``ddp``: DistributedDataParallel defaults (bucket_cap_mb 25, broadcast_buffers);
  ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer, then on the root (FULL_SHARD semantics:
  reshard_after_forward=True)

Measurement: --warmup steps (default 3, the first allocates the optimizer states), then --steps timed steps (default
5), back to back, CUDA events per step on every rank, the per-step max over ranks, median. Peak memory per GPU:
torch.cuda.max_memory_allocated / max_memory_reserved over the timed steps (steady state) and over the whole case
(first step included), per rank and max. tokens/s = batch * seq * world / median step. Energy: NVML counter over the
timed steps, summed over ranks. A case that runs out of memory is recorded ``status: oom`` ("does not fit" is a
result); the suite includes cases expected not to fit 80 GB.

Processes: the parent never touches CUDA. Cases run in spawned workers (torch.multiprocessing, one per GPU, NCCL;
gloo on a CPU) grouped by world size; rank 0 sends each result to the parent, which writes the JSONL line at once.
A worker that dies or hangs (a collective timed out after a one-sided failure) ends its group: the case in flight is
recorded as error and the group is relaunched for the remaining cases while the budget lasts. NVLink multicast stays
off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) in every process.
"""
from __future__ import annotations

import argparse
import os
import queue as queue_mod
import socket
import statistics
import time
from datetime import timedelta

from . import common

SCRIPT = "train_step"
COLLECTIVE_TIMEOUT_S = 90
POLL_S = 0.5

# The --suite: (model, precision, ckpt, batch, seq, strategy, world). Per-GPU batch. Expected on 80 GB (estimates,
# the measurement decides): the 3B bf16-mixed cases without checkpointing at 8 x 2048 do not fit (~51 GB of fp32
# weights, grads and AdamW states on one GPU plus ~90 GB of activations); 3B bf16-true 4 x 2048 is near the limit.
SUITE = [
    ("llama-1b", "bf16-mixed", False, 4, 2048, "plain", 1),
    ("llama-1b", "bf16-true", False, 4, 2048, "plain", 1),
    ("llama-1b", "bf16-mixed", True, 8, 1024, "plain", 1),
    ("llama-3b", "bf16-mixed", True, 4, 2048, "plain", 1),
    ("llama-3b", "bf16-true", False, 4, 2048, "plain", 1),
    ("llama-3b", "bf16-mixed", False, 8, 2048, "plain", 1),      # expected: oom
    ("llama-1b", "bf16-mixed", False, 4, 2048, "ddp", 2),
    ("llama-1b", "bf16-mixed", False, 4, 2048, "fsdp2", 2),
    ("llama-3b", "bf16-mixed", True, 4, 2048, "ddp", 2),
    ("llama-3b", "bf16-mixed", True, 4, 2048, "fsdp2", 2),
    ("llama-3b", "bf16-true", False, 4, 2048, "fsdp2", 2),
    ("llama-1b", "bf16-true", False, 8, 1024, "ddp", 2),
    ("llama-3b", "bf16-mixed", False, 8, 2048, "fsdp2", 2),      # expected: oom
]
# 4 GPUs (and 1-GPU cases that run out of memory on an 80 GB card): --suite4
SUITE4 = [
    ("llama-1b", "bf16-mixed", False, 4, 2048, "plain", 1),
    ("llama-3b", "bf16-mixed", False, 8, 2048, "plain", 1),      # expected on 80 GB: oom
    ("llama-1b", "bf16-mixed", False, 4, 2048, "ddp", 4),
    ("llama-1b", "bf16-mixed", False, 4, 2048, "fsdp2", 4),
    ("llama-3b", "bf16-mixed", True, 4, 2048, "fsdp2", 4),
    ("llama-3b", "bf16-true", False, 4, 2048, "ddp", 4),
    ("llama-3b", "bf16-mixed", False, 8, 2048, "ddp", 4),        # expected on 80 GB: oom (DDP keeps full states)
]
# One GPU, every precision mode of a 1B model (Lightning's names; 16-mixed with a GradScaler): --suite-precision
PRECISIONS = ("bf16-mixed", "bf16-true", "16-mixed", "32-true")
SUITE_PRECISION = [("llama-1b", p, False, 4, 2048, "plain", 1) for p in PRECISIONS]
# One GPU, 32-true around the attention path (fp32 with grouped KV heads runs SDPA's math kernel, whose softmax
# matrix is kept per layer): sizes that fit, one with checkpointing, and the 4 x 2048 that ran out of memory.
# --suite-fp32
SUITE_FP32 = [
    ("llama-1b", "32-true", False, 1, 2048, "plain", 1),
    ("llama-1b", "32-true", False, 2, 2048, "plain", 1),
    ("llama-1b", "32-true", False, 8, 512, "plain", 1),
    ("llama-1b", "32-true", True, 4, 2048, "plain", 1),
    ("llama-3b", "32-true", False, 1, 2048, "plain", 1),
    ("llama-1b", "32-true", False, 4, 2048, "plain", 1),        # expected: oom
]
# One GPU, MoE training in HF eager (transformers' grouped-GEMM experts, random weights: near-uniform routing): the
# whole OLMoE in bf16-true, and layer-cut OLMoE / Qwen1.5-MoE / Mixtral (harness/configs/*-8l.json, *-4l.json);
# bf16-mixed runs the experts in fp32 (grouped_mm is not autocast-enabled; ATen's per-group fallback); the last
# case is expected not to fit. --suite-moe
SUITE_MOE = [
    ("olmoe-1b-7b", "bf16-true", False, 2, 1024, "plain", 1),
    ("olmoe-1b-7b", "bf16-true", True, 4, 1024, "plain", 1),
    ("olmoe-1b-7b-8l", "bf16-true", False, 8, 1024, "plain", 1),
    ("olmoe-1b-7b-8l", "bf16-mixed", False, 4, 1024, "plain", 1),
    ("qwen1.5-moe-a2.7b-8l", "bf16-true", False, 4, 1024, "plain", 1),
    ("mixtral-8x7b-4l", "bf16-true", False, 4, 1024, "plain", 1),
    ("mixtral-8x7b-4l", "bf16-mixed", True, 2, 1024, "plain", 1),    # expected: oom (97 GB predicted)
]
# the suite flags (argparse dests) in the order they take precedence
SUITES = {"suite4": SUITE4, "suite_precision": SUITE_PRECISION, "suite_fp32": SUITE_FP32, "suite_moe": SUITE_MOE,
          "suite": SUITE}
SMOKE = [
    ("tiny-llama", "bf16-mixed", True, 2, 32, "plain", 1),
    ("tiny-llama", "bf16-true", False, 2, 32, "plain", 1),
    ("tiny-llama", "bf16-mixed", False, 2, 32, "ddp", 2),
    ("tiny-llama", "bf16-mixed", True, 2, 32, "fsdp2", 2),
]


def make_case(model, precision, ckpt, batch, seq, strategy, world) -> dict:
    key = f"{model}/{strategy}x{world}/{precision}/{'ckpt' if ckpt else 'nockpt'}/{batch}x{seq}"
    return {"key": key, "model": model, "precision": precision, "ckpt": bool(ckpt), "batch": int(batch),
            "seq": int(seq), "strategy": strategy, "world": int(world)}


# ------------------------------------------------------------------------------------------------------ worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reduce(values: list[float], op: str, device) -> list[float]:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op={"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


def _gather(obj) -> list:
    import torch.distributed as dist

    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _make_optimizer(params, device, prefer_fused: bool = True):
    import torch

    if prefer_fused:
        try:
            return torch.optim.AdamW(params, lr=1e-5, fused=True), "fused"
        except Exception:  # noqa: BLE001 - fused unsupported for these params / device
            pass
    return torch.optim.AdamW(params, lr=1e-5, foreach=True), "foreach"


def run_case(case: dict, rank: int, world: int, device, args) -> dict:
    """One case on this rank (all ranks of the group call it together). Raises on OOM / errors."""
    import contextlib

    import torch

    t_case = time.perf_counter()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    precision = case["precision"]
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}")
    mixed = precision.endswith("-mixed")
    half = torch.float16 if precision == "16-mixed" else torch.bfloat16
    dtype = torch.float32 if mixed or precision == "32-true" else torch.bfloat16
    config = common.hf_config(case["model"], use_cache=False)
    model = common.build_causal_lm(config, dtype, device, attn_implementation="sdpa", seed=args.seed)
    model.train()
    n_params = common.param_count(model)
    if case["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    info = {"params": n_params, "attn_implementation": model.config._attn_implementation,
            "weights_dtype": str(dtype).replace("torch.", "")}
    autocast = contextlib.nullcontext
    if case["strategy"] == "plain":
        if world != 1:
            raise ValueError("plain runs on one GPU")
        wrapped = model
        if mixed:
            autocast = lambda: torch.autocast(device.type, dtype=half)  # noqa: E731
            info["mixed_precision_impl"] = f"torch.autocast({str(half)[6:]}), fp32 master weights"
    elif case["strategy"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, device_ids=[device.index] if cuda else None)
        info["ddp"] = {"bucket_cap_mb": 25, "broadcast_buffers": True, "gradient_as_bucket_view": False}
        if mixed:
            autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
            info["mixed_precision_impl"] = "torch.autocast(bf16), fp32 master weights, fp32 gradient all-reduce"
    elif case["strategy"] == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
        kwargs = {"mp_policy": policy} if policy is not None else {}
        for layer in model.model.layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        wrapped = model
        info["fsdp2"] = {"units": len(model.model.layers) + 1, "reshard_after_forward": True,
                         "mp_policy": "param bf16, reduce fp32" if mixed else None}
        if mixed:
            info["mixed_precision_impl"] = "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)"
    else:
        raise ValueError(f"unknown strategy {case['strategy']!r}")
    params = list(model.parameters())   # a list: a failed fused constructor must not consume a generator
    optimizer, impl = _make_optimizer(params, device, prefer_fused=not args.no_fused)
    g = torch.Generator(device=device)
    g.manual_seed(args.seed + 1000 * rank)
    ids = torch.randint(0, int(config.vocab_size), (case["batch"], case["seq"]), generator=g, device=device)
    losses = []

    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None
    if scaler is not None:
        info["grad_scaler"] = "torch.amp.GradScaler (Lightning's 16-mixed)"

    def step():
        with autocast():
            loss = wrapped(input_ids=ids, labels=ids, use_cache=False).loss
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    for i in range(args.warmup):
        if i == 0 and impl == "fused":
            try:
                step()
            except Exception as exc:   # noqa: BLE001 - a fused kernel that rejects these tensors: fall back
                if common.classify_error(exc)[0] == "oom":
                    raise
                optimizer.zero_grad(set_to_none=True)
                optimizer, impl = _make_optimizer(params, device, prefer_fused=False)
                info["fused_error"] = common.classify_error(exc)[1][:200]
                step()
        else:
            step()
    common.sync(device)
    info["optimizer_impl"] = f"torch.optim.AdamW ({impl})"
    first = common.memory(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    energy = common.EnergyWindow(device)
    energy.start()                      # waits for a step of the NVML energy counter (<= ~0.1 s)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()                  # the ranks start the timed steps together
    common.sync(device)
    times = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            times.append((start, end))
        else:
            c0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - c0) * 1e3)
    common.sync(device)
    wall = time.perf_counter() - t0
    window = energy.stop()
    ms = [s.elapsed_time(e) for s, e in times] if cuda else times
    steady = common.memory(device)
    loss_values = [float(x) for x in losses[-args.steps:]]
    # combine the ranks
    ms_max = _reduce(ms, "max", device)
    wall_max = _reduce([wall], "max", device)[0]
    per_rank = _gather({"rank": rank, "peak_allocated_gb": steady["peak_allocated_gb"],
                        "peak_reserved_gb": steady["peak_reserved_gb"],
                        "first_peak_allocated_gb": first["peak_allocated_gb"],
                        "first_peak_reserved_gb": first["peak_reserved_gb"], "energy_j": window["energy_j"],
                        "step_ms_median": round(statistics.median(ms), 3)})
    energies = [r["energy_j"] for r in per_rank]
    median = statistics.median(ms_max)
    tokens = case["batch"] * case["seq"] * world

    def mx(key):
        values = [r[key] for r in per_rank if r[key] is not None]
        return max(values) if values else None

    model_flops = 6.0 * n_params * tokens
    result = {
        **info, "world": world, "steps": len(ms_max), "warmup": args.warmup,
        "step_ms_median": round(median, 3), "step_ms_mean": round(statistics.fmean(ms_max), 3),
        "step_ms_min": round(min(ms_max), 3), "step_ms_max": round(max(ms_max), 3),
        "step_ms": common.rounded(ms_max, 3), "window_s": round(wall_max, 4),
        "tokens_per_step": tokens, "tokens_per_s": round(tokens / (median / 1e3), 1),
        "tokens_per_s_per_gpu": round(tokens / world / (median / 1e3), 1),
        "model_tflops_per_gpu_6nd": round(model_flops / world / (median / 1e3) / 1e12, 2),
        "peak_allocated_gb": mx("peak_allocated_gb"), "peak_reserved_gb": mx("peak_reserved_gb"),
        "first_peak_allocated_gb": mx("first_peak_allocated_gb"),
        "first_peak_reserved_gb": mx("first_peak_reserved_gb"), "per_rank": per_rank,
        "energy_j_per_step": (round(sum(energies) / len(ms_max), 3) if all(e is not None for e in energies)
                              else None),
        "loss_last": round(loss_values[-1], 4) if loss_values else None,
        "case_s": round(time.perf_counter() - t_case, 2),
    }
    wrapped = model = optimizer = ids = None     # free the case's memory before the next one  # noqa: F841
    params.clear()
    losses.clear()
    return result


def _inject_fault(key: str, rank: int) -> None:
    """Test hook (tests/test_harness_cpu.py): HARNESS_FAULT='oom:TEXT' raises an out-of-memory error on every rank,
    'crash:TEXT' kills rank 0, for the cases whose key contains TEXT."""
    fault = os.environ.get("HARNESS_FAULT", "")
    kind, _, text = fault.partition(":")
    if not text or text not in key:
        return
    if kind == "oom":
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory (injected by HARNESS_FAULT)")
    if kind == "crash" and rank == 0:
        os._exit(3)


def _agree(status: str, message: str | None, world: int) -> tuple[str, str | None]:
    if world == 1:
        return status, message
    gathered = _gather((status, message))
    for wanted in ("oom", "error"):
        for s, m in gathered:
            if s == wanted:
                return s, m
    return "ok", None


def _worker(rank: int, world: int, cases: list[dict], args_dict: dict, port: int, queue, deadline: float | None,
            send_header: bool) -> None:
    common.set_env()
    import torch
    import torch.distributed as dist

    args = argparse.Namespace(**args_dict)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:   # CPU ranks (smoke): share the cores; one thread each for the tiny smoke model (common.smoke_threads)
        torch.set_num_threads(1 if args.smoke else max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                                device_id=device if cuda else None)
    try:
        if rank == 0 and send_header:
            try:
                nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
            except Exception:  # noqa: BLE001 - an int on old versions, missing on builds without NCCL
                nccl = None
            queue.put(("header", None, common.header(SCRIPT, args, gpus_used=world, nccl=nccl)))
        for case in cases:
            go = [deadline is None or time.time() < deadline]
            if world > 1:
                dist.broadcast_object_list(go, src=0)
            if not go[0]:
                if rank == 0:
                    queue.put(("stopped", case["key"], None))
                return
            if rank == 0:
                queue.put(("start", case["key"], None))
            status, message, result = "ok", None, None
            try:
                _inject_fault(case["key"], rank)
                result = run_case(case, rank, world, device, args)
            except Exception as exc:  # noqa: BLE001 - recorded; the group goes on
                status, message = common.classify_error(exc)
                if common.is_fatal_device_error(exc):
                    if rank == 0:
                        queue.put(("result", case["key"], {"status": "error", "error": message, "fatal": True}))
                    raise
            common.free_memory()
            status, message = _agree(status, message, world)
            if rank == 0:
                record = {"status": status}
                if status == "ok":
                    record.update(result)
                else:
                    record["error"] = message
                queue.put(("result", case["key"], record))
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------------ parent


def run_group(cases: list[dict], world: int, args, out: common.JsonlOut, budget: common.Budget, state: dict) -> None:
    """Run ``cases`` (all of one world size) in spawned workers, relaunching after a worker dies."""
    import torch.multiprocessing as mp

    import torch

    pending = list(cases)
    by_key = {c["key"]: c for c in cases}
    while pending:
        if budget.expired():
            break
        deadline = budget.deadline
        args_dict = {k: v for k, v in vars(args).items()}
        if world == 1 and not torch.cuda.is_available():
            # No GPU (smoke tests): one rank needs no process of its own (there is no CUDA context to keep out
            # of the parent), so it runs here; a spawned interpreter would cost seconds of imports.
            q = queue_mod.Queue()
            _worker(0, 1, pending, args_dict, 0, q, deadline, not state["header"])
            context = _Finished()
        else:
            q = mp.get_context("spawn").Queue()
            context = mp.start_processes(_worker, args=(world, pending, args_dict, _free_port(), q, deadline,
                                                        not state["header"]),
                                         nprocs=world, join=False, start_method="spawn")
        in_flight, done, failure, stopped = None, set(), None, False
        start_times = {}

        def drain():
            nonlocal in_flight, stopped
            while True:
                try:
                    kind, key, payload = q.get(timeout=0.05)
                except queue_mod.Empty:
                    return
                if kind == "header":
                    if not state["header"]:
                        out.write(payload)
                        state["header"] = True
                elif kind == "start":
                    in_flight = key
                    start_times[key] = time.time()
                    print(f"[train] start {key}", flush=True)
                elif kind == "stopped":
                    stopped = True
                elif kind == "result":
                    done.add(key)
                    in_flight = None
                    emit(by_key[key], payload, out, state)

        while True:
            drain()
            try:
                if context.join(timeout=POLL_S):
                    break
            except Exception as exc:  # noqa: BLE001 - a worker died; torch terminated the others
                failure = f"worker failed: {type(exc).__name__}: {exc}"[:common.ERROR_CHARS]
                break
        drain()
        if stopped:
            break
        # Cases run in order, so the first one without a result was in flight when the group ended (its "start"
        # message may have died with the worker's queue feeder thread).
        in_flight = next((c["key"] for c in pending if c["key"] not in done), None)
        if in_flight is not None and (failure or not budget.expired()):
            status = "oom" if failure and "out of memory" in failure.lower() else "error"
            emit(by_key[in_flight], {"status": status, "error": failure or "worker exited without a result",
                                     "group_crashed": True}, out, state)
            done.add(in_flight)
        remaining = [c for c in pending if c["key"] not in done]
        if len(remaining) == len(pending):      # no progress at all: do not loop forever
            for c in remaining:
                emit(c, {"status": "error", "error": failure or "worker group made no progress"}, out, state)
            break
        pending = remaining


class _Finished:
    """Stands for the process context of a group that already ran in this process."""

    @staticmethod
    def join(timeout=None) -> bool:
        return True


def ensure_header(out: common.JsonlOut, state: dict) -> None:
    """The provenance line from the parent, where no worker sent one (cases skipped or the budget spent before any
    group ran; no worker starts after this, so a CUDA context in the parent does no harm)."""
    if not state["header"]:
        out.write(common.header(SCRIPT, state.get("args"), written_by="parent (no worker ran)"))
        state["header"] = True


def emit(case: dict, payload: dict, out: common.JsonlOut, state: dict) -> None:
    ensure_header(out, state)
    record = {"type": "case", **case, **payload}
    out.write(record)
    state["rows"].append(record)
    print(f"[train] {case['key']}: {record['status']} step {record.get('step_ms_median')} ms, "
          f"peak {record.get('peak_allocated_gb')} GB {record.get('error', '')[:160]}", flush=True)


def main(argv=None) -> int:
    parser = common.harness_parser(__doc__, "tiny model on the CPU: plain, DDP and FSDP2 (gloo)")
    parser.add_argument("--suite", action="store_true", help="the predefined case list (module SUITE)")
    parser.add_argument("--suite4", action="store_true", help="the 4-GPU case list (module SUITE4)")
    parser.add_argument("--suite-precision", action="store_true", help="every precision mode on one GPU")
    parser.add_argument("--suite-fp32", action="store_true", help="32-true sizes on one GPU (SDPA math path)")
    parser.add_argument("--suite-moe", action="store_true", help="MoE training steps on one GPU (HF eager experts)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs available; cases needing more are skipped")
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--precision", default="bf16-mixed", choices=list(PRECISIONS))
    parser.add_argument("--ckpt", action="store_true", help="activation checkpointing")
    parser.add_argument("--batch", type=int, default=4, help="per GPU")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--strategy", default=None, choices=["plain", "ddp", "fsdp2"],
                        help="default: plain for 1 GPU, fsdp2 for more")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-fused", action="store_true", help="foreach AdamW instead of fused")
    parser.add_argument("--only", default=None, help="suite cases whose key contains this text")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    common.set_env()
    if args.smoke:
        cases = [make_case(*c) for c in SMOKE]
        args.steps, args.warmup = 2, 1
        args.gpus = max(args.gpus, 2)
    elif any(getattr(args, flag) for flag in SUITES):
        chosen = next(SUITES[flag] for flag in SUITES if getattr(args, flag))
        cases = [make_case(*c) for c in chosen]
    else:
        strategy = args.strategy or ("plain" if args.gpus == 1 else "fsdp2")
        world = 1 if strategy == "plain" else args.gpus
        cases = [make_case(args.model, args.precision, args.ckpt, args.batch, args.seq, strategy, world)]
    if args.only:
        cases = [c for c in cases if args.only in c["key"]]
    out = common.JsonlOut(args.out)
    budget = common.Budget(args.max_minutes)
    state = {"header": False, "rows": [], "args": args}
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else None   # no CUDA context in the parent
    try:
        for world in sorted({c["world"] for c in cases}):
            group = [c for c in cases if c["world"] == world]
            usable = args.gpus if have is None else min(args.gpus, have)
            if world > usable:
                for c in group:
                    emit(c, {"status": "skipped", "error": f"needs {world} GPUs, {usable} available"}, out, state)
                continue
            run_group(group, world, args, out, budget, state)
    except KeyboardInterrupt:
        ensure_header(out, state)
        out.write({"type": "stopped", "reason": "interrupt"})
    finished = {r["key"] for r in state["rows"]}
    left = [c["key"] for c in cases if c["key"] not in finished]
    if left:
        ensure_header(out, state)
        out.write({"type": "stopped", "reason": "time budget", "not_run": left})
    common.print_table(state["rows"], ["key", "status", "step_ms_median", "tokens_per_s", "peak_allocated_gb",
                                       "peak_reserved_gb", "optimizer_impl"], title="train_step")
    if left:
        print(f"not run (budget): {', '.join(left)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
