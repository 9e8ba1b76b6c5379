"""Where the time of a tensor- / expert-parallel MoE step goes: torch.profiler over a few decode steps of one case,
one process per GPU, with the experts split by width (ep 1) or by index (ep = tp), as validation/suites/tp2-moe*.yaml
measure them (validation/tp.py). Prints, per split, rank 0's step time and its top CPU-side ops and CUDA runtime
calls, and writes them as JSON lines.

    python3 -m aisim.validation.harness.ep_profile --model validation/harness/configs/mixtral-8x7b-16l.json \\
        --out $OUT/ep-profile-h100.jsonl [--batch 1] [--seq 1024] [--steps 5]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, args, ep: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from aisim.validation import gpu
    from aisim.validation.measure import build_model, prepare
    from aisim.validation.suite import Case, MeasureSettings

    gpu.set_safe_env()
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=device)
    try:
        case = Case(model=args.model, workload="decode", batch=args.batch, seq=args.seq, dtype="bf16", tp=world,
                    ep=ep)
        bm = build_model(args.model, "bf16", device, rank=rank, world=world, ep=ep)
        steps = prepare(bm, case, MeasureSettings())
        for _ in range(3):
            steps.step()
            steps.after()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            steps.step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            steps.after()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                steps.step()
                torch.cuda.synchronize()
                steps.after()
        if rank == 0:
            rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:40]
            record = {"type": "profile", "model": args.model, "batch": args.batch, "seq": args.seq, "tp": world,
                      "ep": ep, "step_ms": sorted(times)[len(times) // 2], "steps": args.steps,
                      "ops": [{"name": e.key, "calls_per_step": e.count / args.steps,
                               "self_cpu_us_per_step": e.self_cpu_time_total / args.steps,
                               "device_us_per_step": getattr(e, "self_device_time_total", 0.0) / args.steps}
                              for e in rows]}
            with open(out, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"ep {ep}: step {record['step_ms']:.2f} ms")
            for o in record["ops"][:25]:
                print(f"  {o['name'][:60]:60s} {o['calls_per_step']:7.1f} calls {o['self_cpu_us_per_step'] / 1e3:7.3f} "
                      f"ms cpu {o['device_us_per_step'] / 1e3:7.3f} ms gpu")
    finally:
        dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from aisim.validation import gpu

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args()
    with open(args.out, "a") as f:
        f.write(json.dumps({"type": "header", **gpu.environment_header(list(range(args.world)), None),
                            "script": "ep_profile", "args": vars(args)}) + "\n")
    for ep in (1, args.world):
        mp.start_processes(_worker, args=(args.world, args, ep, _free_port(), args.out), nprocs=args.world,
                           join=True, start_method="spawn")
    os.sync()


if __name__ == "__main__":
    main()
