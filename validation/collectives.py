"""NCCL collective microbenchmarks (one process per GPU) and the alpha-beta fit of their times.

Bus bytes follow the nccl-tests convention (doc/PERFORMANCE.md there): for a message of ``size`` bytes on
n ranks, all-reduce moves 2*(n-1)/n*size per rank, all-gather (size = the gathered output) (n-1)/n*size and
all-to-all (size = each rank's send buffer, torch's all_to_all_single: an ncclSend/ncclRecv to every peer)
(n-1)/n*size.
The fit is t = latency_s + bus_bytes / bus_bw_bytes_per_s, by least squares on the measured points, with
relative residuals by default so that 20 us small-message latencies and ms-long large transfers weigh alike.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1),
set in this process before the workers start and again in each worker: on shared hosts a program that uses it
can put the GPUs out of service.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from .gpu import NCCL_SAFE_ENV as SAFE_ENV     # NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, ...

OPS = ("all_reduce", "all_gather", "all_to_all")
SIZES_BYTES = tuple(4096 * 4**i for i in range(10))          # 4 KiB .. 1 GiB
QUICK_SIZES_BYTES = SIZES_BYTES[::3]                          # 4 KiB, 256 KiB, 16 MiB, 1 GiB


CPU_ISSUE_CALLS = 1000  # back-to-back 4-byte all-reduces, wall time / calls = issue cost (GPU-bound if larger)
METHOD = ("one process per GPU, NCCL, NVLS off; per op and size the mean of back-to-back iterations: time_s "
          "host-paced (slowest rank), gpu_time_s with a sleep kernel queued ahead so the calls run back to back on "
          "the GPU (the rank that arrived last); the issue cost: wall time of tiny all-reduces (slowest rank)")
SLEEP_CYCLES_PER_CALL = 400_000   # torch.cuda._sleep ahead of the GPU-side timing: 200 us a call at 2 GHz, several
#                                   times the host's issue cost of one collective (24-55 us measured here)


def bus_bytes(op: str, size_bytes: float, world_size: int) -> float:
    """nccl-tests bus bytes: all_reduce 2*(n-1)/n*size, all_gather (n-1)/n*size (size = output bytes), all_to_all
    (n-1)/n*size (size = one rank's send buffer)."""
    factor = {"all_reduce": 2.0, "all_gather": 1.0, "all_to_all": 1.0}[op]
    return factor * (world_size - 1) / world_size * size_bytes


def fit_alpha_beta(bus_bytes_list: list[float], times_s: list[float], *, relative: bool = True
                   ) -> tuple[float, float]:
    """Least squares t = a + x / bw over points (x bus bytes, t seconds) -> (latency a, bus bandwidth bw).

    relative=True minimises sum(((a + b*x) - t) / t)^2 (weights 1/t^2), else plain sum((a + b*x) - t)^2.
    Closed form of weighted least squares: with weights w, Sw = sum w, Sx = sum w x, St = sum w t,
    Sxx = sum w x^2, Sxt = sum w x t: b = (Sw Sxt - Sx St) / (Sw Sxx - Sx^2), a = (St - b Sx) / Sw.
    The latency is floored at 0 (a negative intercept means the points are not affine; see the notes).
    """
    if len(bus_bytes_list) != len(times_s) or len(set(bus_bytes_list)) < 2:
        raise ValueError("fit_alpha_beta needs matching lists with at least two distinct sizes")
    w = [1.0 / t**2 if relative else 1.0 for t in times_s]
    sw, sx, st = sum(w), sum(wi * x for wi, x in zip(w, bus_bytes_list)), sum(wi * t for wi, t in zip(w, times_s))
    sxx = sum(wi * x * x for wi, x in zip(w, bus_bytes_list))
    sxt = sum(wi * x * t for wi, x, t in zip(w, bus_bytes_list, times_s))
    b = (sw * sxt - sx * st) / (sw * sxx - sx * sx)
    a = (st - b * sx) / sw
    if b <= 0:
        raise ValueError("collective times do not grow with size: no bandwidth can be fitted")
    return max(a, 0.0), 1.0 / b


def fit_collectives(records: list[dict]) -> tuple[dict, list[str]]:
    """Collective records -> ({'allreduce_latency_s', 'allreduce_bus_bw_bytes_per_s'}, notes).
    Both None when no all-reduce was measured (one GPU); the all-gather and all-to-all fits go to the notes only."""
    fields: dict = {"allreduce_latency_s": None, "allreduce_bus_bw_bytes_per_s": None}
    notes = []
    for op in OPS:
        rows = [r for r in records if r["bench"] == "collective" and r["op"] == op and r.get("time_s")]
        if len({r["size_bytes"] for r in rows}) < 2:
            continue
        n = rows[0]["world_size"]
        # the GPU-side times where measured (the host issuing ahead); older records have only the host-paced ones
        # (the rank that arrived last: its per-rank minimum; gpu_time_s of the files written before it took that
        # was the slowest rank's)
        key = "gpu_time_s" if all(r.get("gpu_time_s") for r in rows) else "time_s"
        times = [min(r.get("gpu_time_s_per_rank") or [r[key]]) if key == "gpu_time_s" else r[key] for r in rows]
        lat, bw = fit_alpha_beta([bus_bytes(op, r["size_bytes"], n) for r in rows], times)
        notes.append(f"{op}: alpha-beta fit of {key} on {len(rows)} sizes {rows[0]['size_bytes']}.."
                     f"{rows[-1]['size_bytes']} B, {n} GPUs (NCCL, nccl-tests bus bytes, relative least squares): "
                     f"latency {lat * 1e6:.2f} us, bus bandwidth {bw / 1e9:.1f} GB/s")
        if op == "all_reduce":
            fields = {"allreduce_latency_s": lat, "allreduce_bus_bw_bytes_per_s": bw}
    issue = [r["wall_per_call_s"] for r in records if r["bench"] == "collective_issue"]
    if issue:
        fields["allreduce_cpu_s"] = issue[0]
        notes.append(f"all_reduce issue cost: {issue[0] * 1e6:.1f} us per call (wall time of {CPU_ISSUE_CALLS} "
                     "back-to-back 4-byte all-reduces, slowest rank)")
    return fields, notes


# ---------------------------------------------------------------- measurement (GPU, one process per GPU)

def measure_collectives(world_size: int, *, quick: bool = False, timeout_s: float = 120.0) -> list[dict]:
    """Spawn one process per GPU, time each op and size (mean of back-to-back iterations, as nccl-tests;
    the slowest rank's time), and return records. Workers still running after ``timeout_s`` are ended."""
    import socket

    import torch.multiprocessing as mp

    os.environ.update(SAFE_ENV)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sizes = QUICK_SIZES_BYTES if quick else SIZES_BYTES
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "collectives.json"
        ctx = mp.start_processes(_worker, args=(world_size, port, list(sizes), str(result)), nprocs=world_size,
                                 join=False, start_method="spawn")
        t_end = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > t_end:
                    raise TimeoutError(f"workers ran past {timeout_s:.0f} s")
        except Exception as err:        # a worker failed (NCCL error) or hung: end ours, measure nothing
            for p in ctx.processes:     # only the workers started just above, by their handles
                if p.is_alive():
                    p.terminate()
            print(f"collectives: not measured ({str(err).splitlines()[0][:200]})", flush=True)
            return []
        return json.loads(result.read_text()) if result.exists() else []


def _iters(size_bytes: int) -> int:
    """Back-to-back iterations per timing: about 256 MB of traffic, between 5 and 50."""
    return max(5, min(50, int(2.56e8 / size_bytes)))


def _bytes(op: str, size: int, world_size: int) -> int:
    """Message size as measured: all_gather's output is world_size x the per-rank fp32 input; all_to_all's send
    buffer world_size equal chunks."""
    per_rank = max(1, size // 4 // world_size)
    return 4 * per_rank * world_size if op in ("all_gather", "all_to_all") else 4 * max(1, size // 4)


def _worker(rank: int, world_size: int, port: int, sizes: list[int], result_path: str) -> None:
    os.environ.update(SAFE_ENV)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            device_id=torch.device("cuda", rank))
    mine = []
    for op in OPS:
        for size in sizes:
            per_rank = max(1, size // 4 // world_size)     # fp32; all_gather output = world_size x input
            out = torch.randn(per_rank * world_size if op != "all_reduce" else max(1, size // 4), device="cuda")
            inp = torch.randn(per_rank * world_size if op == "all_to_all" else per_rank, device="cuda")
            call = ((lambda: dist.all_reduce(out)) if op == "all_reduce"
                    else (lambda: dist.all_gather_into_tensor(out, inp)) if op == "all_gather"
                    else (lambda: dist.all_to_all_single(out, inp)))
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            n = _iters(size)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(n):
                call()
            e.record()
            torch.cuda.synchronize()
            wall = s.elapsed_time(e) * 1e-3 / n
            # the same calls with the host ahead: a sleep kernel queued first holds the stream while the host issues
            # them, so they run back to back on the GPU (small messages above are bound by the host's issue cost)
            dist.barrier()
            torch.cuda.synchronize()
            torch.cuda._sleep(int(n * SLEEP_CYCLES_PER_CALL))
            s.record()
            for _ in range(n):
                call()
            e.record()
            torch.cuda.synchronize()
            mine.append((wall, s.elapsed_time(e) * 1e-3 / n))
    tiny = torch.ones(1, device="cuda")
    for _ in range(20):
        dist.all_reduce(tiny)
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(CPU_ISSUE_CALLS):
        dist.all_reduce(tiny)
    torch.cuda.synchronize()
    mine.append(((time.perf_counter() - t0) / CPU_ISSUE_CALLS, None))
    every = [None] * world_size
    dist.all_gather_object(every, mine)
    if rank == 0:
        keys = [(op, size) for op in OPS for size in sizes]
        recs = [{"bench": "collective", "op": op, "world_size": world_size, "size_bytes": _bytes(op, size, world_size),
                 "time_s": max(r[i][0] for r in every), "time_s_per_rank": [r[i][0] for r in every],
                 "median_rank_time_s": statistics.median(r[i][0] for r in every),
                 # the rank that arrived last waited for no other: its time is the collective's (the others' add
                 # the start skew of their sleeps)
                 "gpu_time_s": min(r[i][1] for r in every), "gpu_time_s_per_rank": [r[i][1] for r in every]}
                for i, (op, size) in enumerate(keys)]
        recs.append({"bench": "collective_issue", "op": "all_reduce", "world_size": world_size,
                     "calls": CPU_ISSUE_CALLS, "wall_per_call_s": max(r[-1][0] for r in every)})
        Path(result_path).write_text(json.dumps(recs))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- CLI: raw files for a system spec

def main(argv: list[str] | None = None) -> int:
    """python -m aisim.validation.collectives --device h100 --gpus 4,2 --out DIR: for each GPU count (the first n GPUs
    of this host), NCCL all-reduce and all-gather over SIZES_BYTES and the issue cost, written at once to
    DIR/<device>x<n>.raw.json (device, provenance, records; the shape of validation/data/collectives/) with the fit
    printed. A count that fails is said and the next one still runs."""
    import argparse
    import datetime
    import shlex
    import socket
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--device", required=True, help="aisim GPU name (hardware_specs/gpus/)")
    parser.add_argument("--gpus", default="2", help="comma-separated GPU counts")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per GPU count")
    args = parser.parse_args(argv)
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.split("\n")[0].strip() or "unknown"
    except OSError:
        driver = "unknown (no nvidia-smi)"
    for n in (int(x) for x in args.gpus.split(",")):
        if n > torch.cuda.device_count():
            print(f"{n} GPUs: only {torch.cuda.device_count()} visible, skipped", flush=True)
            continue
        t0 = time.monotonic()
        records = measure_collectives(n, timeout_s=args.timeout_s)
        fields, notes = fit_collectives(records)
        provenance = {"gpu_name": torch.cuda.get_device_name(0), "driver": driver, "cuda": str(torch.version.cuda),
                      "torch": torch.__version__,
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "command": shlex.join([sys.executable, "-m", "aisim.validation.collectives", *(argv or
                                                                                                     sys.argv[1:])]),
                      "hostname": socket.gethostname(), "gpu_count": str(n), "host_gpu_count":
                      str(torch.cuda.device_count()), "benchmark_wall_s": f"{time.monotonic() - t0:.0f}",
                      "method": METHOD}
        path = args.out / f"{args.device}x{n}.raw.json"
        path.write_text(json.dumps({"device": args.device, "provenance": provenance, "records": records,
                                    "fit": fields}, indent=1))
        print(f"{path}: {len(records)} records; " + "; ".join(notes), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
