"""Tensor-parallel cases: one process per GPU (torch.multiprocessing spawn), torch.distributed NCCL (gloo on CPU).

``run_tp_group`` builds the group's model once per rank (sharded with ``tp.shard_model``), measures the cases in
order and sends rank 0's combined result of each to the parent through a queue, which the parent drains while
the workers run. A case that fails on any rank is reported as oom/error and the group goes on; a worker that
dies (a collective timed out after a one-sided failure, a crash) ends the group and its unfinished cases are
reported as errors. NVLink multicast stays off in every process (gpu.NCCL_SAFE_ENV).
"""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Callable

from . import gpu
from .suite import Case, MeasureSettings

COLLECTIVE_TIMEOUT_S = 300   # a rank stuck in a collective (its peer failed one-sided) is aborted after this
POLL_S = 0.5
ERROR_CHARS = 600


def classify_error(exc: BaseException) -> tuple[str, str]:
    """('oom' | 'error', message) for an exception raised while building or measuring."""
    text = f"{type(exc).__name__}: {exc}"
    try:
        import torch

        oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                      getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    except ImportError:
        oom_types = ()
    is_oom = (oom_types and isinstance(exc, oom_types)) or "out of memory" in str(exc).lower()
    return ("oom" if is_oom else "error"), text[:ERROR_CHARS]


def is_fatal_device_error(exc: BaseException) -> bool:
    """A CUDA error that poisons the process's context (device-side assert, illegal address): nothing more
    can run in this process."""
    text = str(exc)
    return type(exc).__name__ == "AcceleratorError" or "device-side assert" in text or "CUDA error" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agree(status: str, message: str | None, world: int) -> tuple[str, str | None]:
    """Combine the ranks' outcomes: any oom -> oom, else any error -> error, else ok (first message kept)."""
    import torch.distributed as dist

    gathered: list = [None] * world
    dist.all_gather_object(gathered, (status, message))
    for wanted in ("oom", "error"):
        for s, m in gathered:
            if s == wanted:
                return s, m
    return "ok", None


def _measure_group(rank: int, world: int, cases: list[Case], settings: MeasureSettings, device, queue,
                   deadline: float | None) -> None:
    import torch.distributed as dist

    from .measure import build_model, free_memory, measure_case

    first = cases[0]
    status, message, bm = "ok", None, None
    try:
        bm = build_model(first.model, first.dtype, device, seed=settings.seed, rank=rank, world=world,
                         tp_scope=first.tp_scope, ep=first.ep)
    except Exception as exc:  # noqa: BLE001 - recorded per case
        status, message = classify_error(exc)
    free_memory()
    status, message = _agree(status, message, world)
    if status != "ok":
        if rank == 0:
            for case in cases:
                queue.put(("result", case.key, status, message, None))
        return
    for case in cases:
        go = [deadline is None or time.time() < deadline]
        dist.broadcast_object_list(go, src=0)
        if not go[0]:
            if rank == 0:
                queue.put(("stopped", case.key, None, None, None))
            return
        result, status, message = None, "ok", None
        try:
            result = measure_case(bm, case, settings)
        except Exception as exc:  # noqa: BLE001 - recorded, the group goes on
            status, message = classify_error(exc)
        free_memory()
        status, message = _agree(status, message, world)
        if rank == 0:
            queue.put(("result", case.key, status, message, result if status == "ok" else None))


def _worker(rank: int, world: int, case_dicts: list[dict], settings_dict: dict, gpus: list[int] | None,
            port: int, queue, deadline: float | None) -> None:
    gpu.set_safe_env()
    import torch
    import torch.distributed as dist

    device = gpu.torch_device(gpus, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # CPU ranks (tests): share the cores instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                            device_id=device if cuda else None)
    try:
        cases = [Case(**d) for d in case_dicts]
        _measure_group(rank, world, cases, MeasureSettings(**settings_dict), device, queue, deadline)
    finally:
        dist.destroy_process_group()


def available_gpus(gpus: list[int] | None) -> int | None:
    """How many GPUs a TP group may use (None where there is no CUDA: ranks then run on CPU with gloo)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return len(gpus) if gpus else torch.cuda.device_count()


def run_tp_group(cases: list[Case], settings: MeasureSettings, *, emit: Callable[..., None],
                 gpus: list[int] | None = None, deadline: float | None = None) -> bool:
    """Measure one TP group (same model, dtype, tp, scope); ``emit(case, status, result=None, error=None)``
    is called in the parent for each case. Returns True if the time budget stopped the group."""
    import queue as queue_mod

    import torch.multiprocessing as mp

    world = cases[0].tp
    have = available_gpus(gpus)
    if have is not None and have < world:
        for case in cases:
            emit(case, "skipped", error=f"tp={world} needs {world} GPUs; {have} available")
        return False
    gpu.set_safe_env()
    q = mp.get_context("spawn").Queue()
    by_key = {c.key: c for c in cases}
    args = (world, [c.model_dump() for c in cases], settings.model_dump(), gpus, _free_port(), q, deadline)
    context = mp.start_processes(_worker, args=args, nprocs=world, join=False, start_method="spawn")
    done, stopped, failure = set(), False, None

    def drain() -> None:
        nonlocal stopped
        while True:
            try:
                kind, key, status, message, result = q.get(timeout=0.05)
            except queue_mod.Empty:
                return
            done.add(key)
            if kind == "stopped":
                stopped = True
            else:
                emit(by_key[key], status, result=result, error=message)

    while True:
        drain()
        try:
            if context.join(timeout=POLL_S):
                break
        except Exception as exc:  # noqa: BLE001 - a worker died; torch terminated the others
            failure = f"tensor-parallel worker failed: {type(exc).__name__}: {exc}"[:ERROR_CHARS]
            break
    drain()
    for case in cases:
        if case.key not in done and not stopped:
            emit(case, "error", error=failure or "tensor-parallel worker exited without a result")
    return stopped
