"""Speed benchmark of the request-level serving simulator (aisim.studies.serve).

    python benchmarks/bench_serve.py [--num-requests 10000] [--rate 28] [--repeats 3]

10,000 ShareGPT-length requests (the built-in `sharegpt` lengths), Poisson arrivals near the capacity of one
replica, a LinearStepTimer with 7B-like coefficients on one H100 SXM (bf16 Llama-2-7B, MHA):
  base_s = 5 ms                  13.5 GB of weights / 3.35 TB/s HBM = 4.0 ms, plus ~1 ms launch and framework;
  per_token_s = 30 us            2 x 6.74e9 FLOP per token / ~450 TFLOP/s achieved (989 dense bf16 peak);
  per_attn_pair_s = 2 ns         4 x 4096 hidden x 32 layers FLOP per query-key pair / ~300 TFLOP/s;
  per_decode_ctx_token_s = 0.16 us  KV of one token, 2 x 32 x 4096 x 2 B = 524,288 B, / 3.35 TB/s;
  per_seq_s = 10 us              sampling and per-sequence bookkeeping;
  power_w = 700                  H100 SXM board power limit.
Engine: 6,500 KV blocks of 16 tokens (about 55 GB of an 80 GB card at gpu_memory_utilization 0.9 after weights
and activations), max_num_seqs 256, max_num_batched_tokens 8192, chunked prefill. The capacity with these numbers
is about 29.5 requests/s (rate inf); --rate 28 runs just under it. Prints the median wall time of the repeats.
"""
from __future__ import annotations

import argparse
import statistics
import time

from aisim.studies.serve import EngineConfig, LinearStepTimer, ServeRequest, run_serving

TIMER_7B_H100 = LinearStepTimer(base_s=5e-3, per_token_s=3e-5, per_attn_pair_s=2e-9, per_decode_ctx_token_s=1.6e-7,
                                per_seq_s=1e-5, power_w=700.0)
ENGINE_7B_H100 = EngineConfig(num_kv_blocks=6500, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=28.0, help="requests/s (inf = all at t = 0)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--router", default="round-robin", choices=["round-robin", "least-loaded"])
    parser.add_argument("--aisim-timer", metavar="MODEL", help="time with aisim's own step costs of MODEL on one "
                        "H100 (transformers-cb engine, KV capacity from the memory model) instead of the linear timer")
    args = parser.parse_args()
    if args.aisim_timer:
        return real_timer(args)
    request = ServeRequest(num_requests=args.num_requests, rate_per_s=args.rate * args.replicas, seed=0,
                           replicas=args.replicas, router=args.router)
    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        run = run_serving(request, TIMER_7B_H100, ENGINE_7B_H100)
        walls.append(time.perf_counter() - t0)
    r = run.result
    print(f"{args.num_requests} requests, sharegpt lengths, {args.rate * args.replicas:g} req/s, "
          f"{args.replicas} replica(s) {args.router}")
    print(f"wall time: median {statistics.median(walls):.2f} s over {args.repeats} runs "
          f"(min {min(walls):.2f}, max {max(walls):.2f}); {r.num_steps} steps, "
          f"{r.num_steps / statistics.median(walls):,.0f} steps/s")
    print(f"simulated: {r.duration_s:.1f} s, {r.request_throughput:.2f} req/s, {r.output_throughput:.0f} tok/s, "
          f"mean TTFT {r.mean_ttft_ms:.1f} ms, p99 TTFT {r.percentiles['p99_ttft_ms']:.1f} ms, "
          f"mean TPOT {r.mean_tpot_ms:.2f} ms, mean ITL {r.mean_itl_ms:.2f} ms, batch {r.mean_running_batch_size:.1f}, "
          f"KV peak {r.kv_cache_peak_utilization:.0%}, preemptions {r.num_preemptions}, "
          f"{r.energy_j_per_output_token:.3f} J/token")


def real_timer(args) -> None:
    """The whole `aisim serve` path: scenario, step-cost timer (its token grid traced or read from the graph
    cache), engine config from the runtime profile and the memory model, then the simulation."""
    from aisim.studies.serve.cli_run import run_serve

    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        report, run, _ = run_serve(model=args.aisim_timer, device="h100", dtype="bf16", tp=None, pp=1, quant="none",
                                   runtime="transformers-cb", calibration="auto", num_requests=args.num_requests,
                                   input_len="sharegpt", output_len="sharegpt", rate=args.rate, arrival="poisson",
                                   seed=0, trace=None, replicas=None, router="round-robin", percentiles="50,99",
                                   knobs={})
        walls.append(time.perf_counter() - t0)
    r = run.result
    print(f"aisim serve {args.aisim_timer} on h100 (transformers-cb), {args.num_requests} sharegpt requests at "
          f"{args.rate:g} req/s: wall time median {statistics.median(walls):.2f} s over {args.repeats} runs "
          f"(first {walls[0]:.2f} s); {r.num_steps} steps; simulated {r.output_throughput:.0f} output tok/s, "
          f"median TPOT {r.median_tpot_ms:.1f} ms")


if __name__ == "__main__":
    main()
