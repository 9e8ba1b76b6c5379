"""aisim.studies.serve: the request-level continuous-batching simulator, with a linear step timer."""
import csv
import math

import numpy as np
import pytest

from aisim.errors import AisimError
from aisim.studies.serve import (BatchShape, EngineConfig, LinearStepTimer, ServeRequest, Workload, run_serving,
                                 simulate_serving, validated, write_requests_csv)
from aisim.studies.serve.metrics import overload, summarize
from aisim.studies.serve.requests import SHAREGPT, arrival_times_s, parse_arrival_cv, parse_length, read_trace
from aisim.studies.serve.simulate import simulate

# 7B-like on one H100 (see benchmarks/bench_serve.py for where each number comes from).
H100_7B = LinearStepTimer(base_s=5e-3, per_token_s=3e-5, per_attn_pair_s=2e-9, per_decode_ctx_token_s=1.6e-7,
                          per_seq_s=1e-5, power_w=700.0)
ENGINE = EngineConfig(num_kv_blocks=7500, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192)


class RecordingTimer:
    """A LinearStepTimer that keeps every shape it was asked about."""

    def __init__(self, inner: LinearStepTimer):
        self.inner, self.shapes = inner, []

    def step_time_s(self, shape: BatchShape) -> float:
        self.shapes.append(shape)
        return self.inner.step_time_s(shape)

    def step_energy_j(self, shape: BatchShape) -> float:
        return self.inner.step_energy_j(shape)


def workload(arrival_s, input_tokens, output_tokens) -> Workload:
    return Workload(np.asarray(arrival_s, dtype=float), np.asarray(input_tokens, dtype=np.int64),
                    np.asarray(output_tokens, dtype=np.int64))


def run(wl: Workload, timer, engine: EngineConfig, replicas=1, router="round-robin", percentiles=(90, 99)):
    return summarize(simulate(wl, timer, engine, replicas=replicas, router=router), list(percentiles))


def test_tiny_case_hand_worked():
    # time = 10 ms + 1 ms per token; power 100 W; blocks of 4 tokens; budget 8 tokens per step.
    # R0 arrives at 0 with 6 prompt tokens, 3 outputs; R1 arrives at 5 ms with 4 prompt tokens, 2 outputs.
    # step 0 @ 0:      R0 prefill 6                -> 10 + 6 = 16 ms, ends 16: R0 token 1 (TTFT 16)
    # step 1 @ 16:     R0 decode 1 + R1 prefill 4  -> 10 + 5 = 15 ms, ends 31: R0 token 2, R1 token 1 (TTFT 26)
    # step 2 @ 31:     R0 decode + R1 decode       -> 10 + 2 = 12 ms, ends 43: R0 token 3, R1 token 2, both done
    # TTFT 16, 26 -> mean 21; E2EL 43, 38 -> mean 40.5; TPOT (43-16)/2 = 13.5, (38-26)/1 = 12 -> mean 12.75
    # ITL 15, 12 (R0) and 12 (R1) -> mean 13, median 12; energy 100 W x 43 ms = 4.3 J over 5 tokens
    # KV: R0 holds 2 blocks (6 tokens, then 7, 8); R1 1 block, a 2nd at step 2 (5 tokens) -> peak 4 of 100
    # contexts: step 1 R0 reads 7; step 2 R0 8 + R1 5 = 13. Prefill pairs: 6 x 6 = 36, 4 x 4 = 16; prefill
    # contexts after the chunk: 6, then 4.
    timer = RecordingTimer(LinearStepTimer(base_s=0.010, per_token_s=0.001, power_w=100.0))
    engine = EngineConfig(num_kv_blocks=100, block_size=4, max_num_seqs=4, max_num_batched_tokens=8)
    result, table = run(workload([0.0, 0.005], [6, 4], [3, 2]), timer, engine, percentiles=[50])
    assert timer.shapes == [BatchShape(6, 36.0, 1, 0, 0.0, 6.0), BatchShape(4, 16.0, 1, 1, 7.0, 4.0),
                            BatchShape(0, 0.0, 0, 2, 13.0, 0.0)]
    assert result.completed == 2 and result.failed == 0 and result.num_steps == 3
    assert result.duration_s == pytest.approx(0.043)
    assert table.ttft_ms.tolist() == pytest.approx([16.0, 26.0])
    assert table.e2el_ms.tolist() == pytest.approx([43.0, 38.0])
    assert table.tpot_ms.tolist() == pytest.approx([13.5, 12.0])
    assert result.mean_ttft_ms == pytest.approx(21.0) and result.mean_e2el_ms == pytest.approx(40.5)
    assert result.mean_tpot_ms == pytest.approx(12.75)
    assert result.mean_itl_ms == pytest.approx(13.0) and result.median_itl_ms == pytest.approx(12.0)
    assert result.percentiles["p50_itl_ms"] == pytest.approx(12.0)
    assert result.request_throughput == pytest.approx(2 / 0.043)
    assert result.output_throughput == pytest.approx(5 / 0.043)
    assert result.total_token_throughput == pytest.approx(15 / 0.043)
    assert result.energy_j == pytest.approx(4.3) and result.energy_j_per_output_token == pytest.approx(0.86)
    assert result.kv_cache_peak_utilization == pytest.approx(0.04)
    assert result.mean_running_batch_size == pytest.approx(5 / 3)
    # vLLM's peaks: all 5 tokens within the first second; R0 [0, 43) and R1 [5, 38) overlap
    assert result.max_output_tokens_per_s == 5.0 and result.max_concurrent_requests == 2
    assert result.request_goodput is None
    for limits, good in (({"ttft": 20.0}, 1), ({"tpot": 12.0}, 1), ({"ttft": 20.0, "tpot": 12.0}, 0),
                         ({"e2el": 43.0}, 2), ({"e2el": 42.0}, 1)):
        res, _ = summarize(simulate(workload([0.0, 0.005], [6, 4], [3, 2]), timer, engine), [50], None, limits)
        assert res.request_goodput == pytest.approx(good / 0.043), limits


def test_goodput_and_peaks_match_vllms_definitions_on_a_random_run():
    """vllm/benchmarks/serve.py calculate_metrics transcribed loop by loop, against the vectorised metrics."""
    req = ServeRequest(num_requests=400, rate_per_s=30.0, seed=7, input_len="uniform:1:600", output_len="uniform:1:80",
                       goodput={"ttft": 60.0, "tpot": 9.0})
    out = run_serving(req, H100_7B, ENGINE.model_copy(update={"max_num_seqs": 16}))
    t, res = out.requests, out.result
    good = 0
    for i in np.flatnonzero(t.completed):
        tpot = (t.e2el_ms[i] - t.ttft_ms[i]) / (t.output_tokens[i] - 1) if t.output_tokens[i] > 1 else 0.0
        good += all(slo >= v for slo, v in ((60.0, t.ttft_ms[i]), (9.0, tpot)))
    assert 0 < good < t.completed.sum()
    assert res.request_goodput == pytest.approx(good / res.duration_s)
    start = min(t.arrival_s[t.completed])
    buckets = np.zeros(int(np.ceil(max(t.finish_s[t.completed]) - start)) + 1)
    for time_s in out.token_time_s:
        buckets[int(time_s - start)] += 1
    events = sorted([(t.arrival_s[i], 1) for i in np.flatnonzero(t.completed)]
                    + [(t.finish_s[i], -1) for i in np.flatnonzero(t.completed)])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    assert res.max_output_tokens_per_s == buckets.max() and res.max_concurrent_requests == peak


class _WaitingTimer(LinearStepTimer):
    idle_power_w = 50.0


def test_lockstep_ranks_share_each_step_and_an_idle_rank_runs_the_dummy_batch():
    # 10 ms + 1 ms per token, 100 W, 50 W waiting. R0 (6 prompt, 3 out) on rank 0, R1 (2 prompt, 1 out) on rank 1,
    # both at t = 0. Independent: rank 0 steps 16, 11, 11 ms (ends 16, 27, 38); rank 1 one step of 12 ms.
    # In lockstep: step 1 lasts max(16, 12) = 16 ms (R1's only token at 16, rank 1 waiting 4 ms), then rank 1 runs
    # the one-token dummy batch (11 ms) beside rank 0's decodes; the wave ends at its 32nd step (vLLM checks for
    # unfinished requests every 32): 29 dummy steps on both ranks after R0's last token at 38 ms.
    timer = _WaitingTimer(base_s=0.010, per_token_s=0.001, power_w=100.0)
    engine = EngineConfig(num_kv_blocks=100, block_size=4, max_num_seqs=4, max_num_batched_tokens=8)
    wl = workload([0.0, 0.0], [6, 2], [3, 1])
    free = simulate(wl, timer, engine, replicas=2)
    tied = simulate(wl, timer, engine, replicas=2, lockstep=2)
    assert free.replicas[1].step_end_s == pytest.approx([0.012])
    ends = [0.016, 0.027, 0.038] + [0.038 + 0.011 * i for i in range(1, 30)]
    assert tied.replicas[0].step_end_s == pytest.approx(ends) and tied.replicas[1].step_end_s == pytest.approx(ends)
    res, table = summarize(tied, [50])
    assert table.e2el_ms.tolist() == pytest.approx([38.0, 16.0])
    # rank 1: its 12 ms step at 100 W and 4 ms waiting for rank 0 at 50 W, then 31 dummy steps
    assert tied.replicas[1].energy_j == pytest.approx(100.0 * 0.012 + 50.0 * 0.004 + 100.0 * 0.011 * 31)
    # the dummy batches are not the replicas' steps: 3 + 1 working steps of one sequence each
    assert res.num_steps == 4 and res.mean_running_batch_size == pytest.approx(1.0)
    with pytest.raises(AisimError, match="groups of 2"):
        simulate(wl, timer, engine, replicas=3, lockstep=2)


@pytest.mark.parametrize("replicas,router", [(1, "round-robin"), (2, "round-robin"), (3, "least-loaded")])
def test_max_concurrency_caps_requests_in_flight_and_counts_latency_from_the_send(replicas, router):
    """vLLM bench's --max-concurrency: never more than the cap between send and finish; the wait for a slot is the
    client queue time, not TTFT; a cap above the requests changes nothing; Little's law holds on the sent stream."""
    kw = dict(num_requests=300, input_len="uniform:50:400", output_len="uniform:10:120", rate_per_s=60.0, seed=3,
              replicas=replicas, router=router)
    free = run_serving(ServeRequest(**kw), H100_7B, ENGINE)
    capped = run_serving(ServeRequest(max_concurrency=6, **kw), H100_7B, ENGINE)
    loose = run_serving(ServeRequest(max_concurrency=300, **kw), H100_7B, ENGINE)
    r = capped.result
    assert r.max_concurrency == 6 and r.max_concurrent_requests <= 6 < free.result.max_concurrent_requests
    assert r.mean_client_queue_time_ms > 0 and r.completed == 300
    t = capped.requests
    assert (t.client_queue_ms >= 0).all() and (t.client_queue_ms > 0).any()
    assert loose.result.mean_ttft_ms == pytest.approx(free.result.mean_ttft_ms)
    assert loose.result.mean_client_queue_time_ms == pytest.approx(0.0)
    assert r.mean_e2el_ms > 0 and r.request_throughput * r.mean_e2el_ms / 1e3 <= 6.0 + 1e-9


def test_max_concurrency_sends_at_the_first_finish_on_any_replica_hand_worked():
    """10 ms + 1 ms per token. Cap 2, 2 replicas: R0 (6 + 3) on replica 0 finishes at 38 ms; R1 (200 + 3) on replica
    1 runs a 210 ms prefill and finishes at 232 ms; R2 arrives at 30 ms, waits for R0's slot, is sent at 38 ms
    (not at the end of replica 1's long step) and, on replica 0, finishes at 38 + 12 = 50 ms. Late in a long trace
    (t = 20,000 s, where 1e-12 s is below a float's resolution) the send still happens."""
    timer = LinearStepTimer(base_s=0.010, per_token_s=0.001, power_w=100.0)
    engine = EngineConfig(num_kv_blocks=1000, block_size=4, max_num_seqs=4, max_num_batched_tokens=256)
    run = simulate(workload([0.0, 0.0, 0.030], [6, 200, 2], [3, 3, 1]), timer, engine, replicas=2, max_concurrency=2)
    sent = [r.arrival_s for r in run.requests]
    assert sent == pytest.approx([0.0, 0.0, 0.038]) and run.requests[2].finish_s == pytest.approx(0.050)
    late = simulate(workload([20000.0, 20000.001], [100, 100], [5, 5]), timer, engine, max_concurrency=1)
    assert late.requests[1].arrival_s == pytest.approx(late.requests[0].finish_s)


def test_littles_law():
    req = ServeRequest(num_requests=3000, rate_per_s=22.0, seed=1)
    res = simulate_serving(req, H100_7B, ENGINE)
    assert res.completed == 3000
    little = res.request_throughput * res.mean_e2el_ms / 1e3
    assert res.mean_requests_in_system == pytest.approx(little, rel=0.03)


def test_low_rate_ttft_is_one_prefill_step_and_tpot_one_decode_step():
    timer = LinearStepTimer(base_s=5e-3, per_token_s=3e-5, per_attn_pair_s=2e-9, per_decode_ctx_token_s=1.6e-7,
                            per_seq_s=1e-5)
    req = ServeRequest(num_requests=20, input_len="100", output_len="10", rate_per_s=0.01, seed=3)
    res = simulate_serving(req, timer, ENGINE)
    prefill_s = timer.step_time_s(BatchShape(100, 100 * 100, 1, 0, 0))
    decode_s = [timer.step_time_s(BatchShape(0, 0, 0, 1, 100 + g)) for g in range(1, 10)]
    assert res.mean_ttft_ms == pytest.approx(prefill_s * 1e3, rel=1e-9)
    assert res.std_ttft_ms == pytest.approx(0.0, abs=1e-9)
    assert res.mean_tpot_ms == pytest.approx(np.mean(decode_s) * 1e3, rel=1e-9)
    assert res.mean_running_batch_size == pytest.approx(1.0)


def _saturated(rate_per_s: float, n: int):
    req = ServeRequest(num_requests=n, input_len="200", output_len="100", rate_per_s=rate_per_s, seed=5)
    return simulate_serving(req, H100_7B, ENGINE)


def test_throughput_saturates_and_ttft_grows_without_bound_past_capacity():
    capacity = _saturated(math.inf, 2000).request_throughput
    for factor in (2, 4):
        small, big = _saturated(factor * capacity, 500), _saturated(factor * capacity, 2000)
        assert big.request_throughput == pytest.approx(capacity, rel=0.05)
        assert big.mean_ttft_ms > 2.5 * small.mean_ttft_ms  # the queue grows with the number of requests
    assert _saturated(4 * capacity, 2000).mean_ttft_ms > _saturated(2 * capacity, 2000).mean_ttft_ms


def test_overload_is_told_past_capacity_and_not_below_it():
    capacity = _saturated(math.inf, 2000).request_throughput
    alone = H100_7B.step_time_s(BatchShape(200, 200.0 * 200, 1, 0, 0.0, 200.0)) + 99 * H100_7B.step_time_s(
        BatchShape(0, 0.0, 0, 1, 250.0))

    def behind(factor, n=1000, seed=5, **engine):
        req = ServeRequest(num_requests=n, input_len="200", output_len="100", rate_per_s=factor * capacity, seed=seed)
        out = run_serving(req, H100_7B, ENGINE.model_copy(update=engine))
        return overload(out.requests, alone)

    assert behind(0.5) is None and behind(0.8) is None
    # a short run at half the capacity: the requests in flight swing by Poisson noise, not told as falling behind
    # (5 of these 16 seeds were, with the noise taken as one count's, not the difference of two)
    assert [behind(0.5, n=300, seed=s) for s in range(16)] == [None] * 16
    for factor in (1.3, 3.0):
        rate_s, in_mid, in_end = behind(factor)
        assert rate_s == pytest.approx(factor * capacity, rel=0.15) and in_end > in_mid
    # an engine that admits every request (vLLM's 1024 sequences): the running batch builds, not the TTFT
    rate_s, in_mid, in_end = behind(1.5, n=600, max_num_seqs=1024)
    assert in_end - in_mid > 0.1 * 300
    assert behind(math.inf) is None    # all at t = 0: a burst, not a rate
    # a short run far past capacity is behind whatever its length; one that may keep up, but whose arrivals end
    # before twice a request's latency alone, is too short to tell
    assert isinstance(behind(30.0, n=200), tuple)
    light = run_serving(ServeRequest(num_requests=60, input_len="200", output_len="100", rate_per_s=0.5 * capacity,
                                     seed=5), H100_7B, ENGINE)
    assert overload(light.requests, 10.0) == "short" and overload(light.requests, alone) is None
    # requests the engine rejects never enter the system: a light load with rejections is not an overload
    wl = workload(np.arange(100) * 0.2, np.r_[np.full(70, 200), np.full(30, 5000)], np.full(100, 20))
    engine = ENGINE.model_copy(update={"max_model_len": 4096})
    res, table = summarize(simulate(wl, H100_7B, engine), [50])
    assert res.failed == 30 and overload(table, 0.1) is None


@pytest.mark.parametrize("router", ["round-robin", "least-loaded"])
def test_more_replicas_never_lower_throughput(router):
    req = dict(num_requests=1500, input_len="uniform:50:400", output_len="uniform:20:300", rate_per_s=120.0,
               seed=7, router=router)
    throughputs = [simulate_serving(ServeRequest(replicas=n, **req), H100_7B, ENGINE).request_throughput
                   for n in (1, 2, 4)]
    assert throughputs[0] <= throughputs[1] * 1.001 and throughputs[1] <= throughputs[2] * 1.001
    assert throughputs[2] > 2.5 * throughputs[0]  # 120 req/s is about 4 replicas' capacity


def test_least_loaded_balances_replicas():
    req = ServeRequest(num_requests=800, input_len="uniform:50:800", output_len="uniform:10:600", rate_per_s=60.0,
                       seed=11, replicas=3, router="least-loaded")
    table = run_serving(req, H100_7B, ENGINE).requests
    counts = np.bincount(table.replica, minlength=3)
    assert counts.min() > 0.25 * len(table.replica)


def test_chunked_prefill_splits_long_prompts():
    timer = RecordingTimer(H100_7B)
    engine = EngineConfig(num_kv_blocks=1000, max_num_batched_tokens=2048, max_num_seqs=8)
    result, _ = run(workload([0.0], [10000], [2]), timer, engine)
    chunks = [s.prefill_tokens for s in timer.shapes if s.prefill_tokens]
    assert chunks == [2048, 2048, 2048, 2048, 1808]
    assert timer.shapes[1].prefill_attn_pairs == 2048 * 4096  # new tokens x context after the chunk
    assert result.completed == 1 and result.num_steps == 6

    timer = RecordingTimer(H100_7B)
    run(workload([0.0], [10000], [2]), timer, engine.model_copy(update={"long_prefill_token_threshold": 1500}))
    assert [s.prefill_tokens for s in timer.shapes if s.prefill_tokens] == [1500] * 6 + [1000]

    no_chunk = validated(EngineConfig, {**engine.model_dump(), "enable_chunked_prefill": False})
    result, _ = run(workload([0.0, 0.0], [10000, 1000], [2, 2]), H100_7B, no_chunk)
    assert result.completed == 1 and result.failed_reasons == {"max_num_batched_tokens": 1}


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_when_kv_scarce_and_every_request_completes(mode):
    # 64 blocks x 16 = 1024 KV tokens for 40 requests that each grow to 100 + 199 tokens.
    engine = EngineConfig(num_kv_blocks=64, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048,
                          preemption_mode=mode, kv_bytes_per_token=131072.0)
    result, table = run(workload(np.zeros(40), np.full(40, 100), np.full(40, 200)), H100_7B, engine)
    assert result.num_preemptions > 0 and result.completed == 40 and result.failed == 0
    assert (table.tokens_emitted == table.output_tokens).all()
    assert table.preemptions.sum() == result.num_preemptions
    assert result.kv_cache_peak_utilization <= 1.0


def test_prefix_caching_gives_a_preempted_request_its_cached_prefix_back():
    """vLLM V1 (prefix caching on by default): a request preempted by recompute frees its blocks but they stay cached
    in the free pool; readmitted, it takes back the prefix no other allocation reused and recomputes only the rest.
    Long prompts over a pool that holds 4.x of them: without caching every preemption re-prefills the prompt and
    the run thrashes (the victim is readmitted on its first chunk's blocks, then preempted again); with it the
    victim waits for its whole prefix's room, and the run takes fewer steps, fewer prefill tokens and preemptions."""
    from aisim.studies.serve.engine import ReplicaScheduler, RequestState

    base = EngineConfig(num_kv_blocks=4 * 1000 + 500, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048)
    cached = base.model_copy(update={"enable_prefix_caching": True})
    wl = workload(np.zeros(5), np.full(5, 15000), np.full(5, 1500))
    timers = {}
    for name, engine in (("off", base), ("on", cached)):
        timers[name] = RecordingTimer(H100_7B)
        result, table = run(wl, timers[name], engine)
        assert result.completed == 5 and (table.tokens_emitted == table.output_tokens).all()
        timers[name].result = result
    off, on = timers["off"], timers["on"]
    assert on.result.num_preemptions >= 1
    assert on.result.num_preemptions < off.result.num_preemptions
    prefill = {k: sum(s.prefill_tokens for s in t.shapes) for k, t in timers.items()}
    assert prefill["on"] < prefill["off"]
    # the hits reported are the prompt tokens not recomputed (beside the fewer preemptions' own recomputes)
    assert off.result.prefix_cache_hit_tokens == 0 and on.result.prefix_cache_hit_tokens > 0
    assert on.result.prefix_cache_hit_tokens % 16 == 0
    assert on.result.duration_s < off.result.duration_s

    # the pool order: a block taken after the preemption evicts the victim's tail first, so its hit shrinks by it
    sched = ReplicaScheduler(EngineConfig(num_kv_blocks=20, block_size=16, max_num_seqs=8,
                                          max_num_batched_tokens=512, enable_prefix_caching=True))
    victim = RequestState(0, 0.0, 160, 50)
    sched.enqueue(victim)
    sched.schedule(0)
    sched.complete(0, 0.1)                      # its prompt computed: 160 tokens in 10 blocks, one token emitted
    assert victim.computed == 160 and victim.blocks == 10
    sched._preempt_tail(1)
    assert victim.cached == 10 and sched.free_blocks == 20
    sched._take(10 + 3)                         # the 10 blocks free before it first, then 3 of its own, tail first
    assert victim.cached == 7 and sched.free_blocks == 7
    sched._give(13)                             # blocks freed later queue behind its prefix, which goes first
    sched._take(5)
    assert victim.cached == 2
    sched._give(5)
    sched.schedule(2)                           # readmitted: its 2 blocks of prefix left are hits
    assert victim.computed == 2 * 16 and sched.cache_hit_tokens == 32 and victim.cached == 0


def test_request_that_never_fits_is_rejected_not_looped():
    engine = EngineConfig(num_kv_blocks=10, block_size=16, max_num_seqs=8, max_num_batched_tokens=256)
    result, table = run(workload([0.0, 0.1, 0.2], [50, 150, 50], [20, 20, 20]), H100_7B, engine)
    assert result.completed == 2 and result.failed == 1 and result.failed_reasons == {"kv_capacity": 1}
    assert table.completed.tolist() == [True, False, True]


def test_length_distributions_parse_and_have_their_means():
    rng = np.random.default_rng(0)
    assert parse_length("128", "input").sample(3, rng).tolist() == [128, 128, 128]
    for spec, mean in [("uniform:100:300", 200), ("normal:500:50", 500), ("lognormal:200:0.8", 200)]:
        assert parse_length(spec, "input").sample(200_000, rng).mean() == pytest.approx(mean, rel=0.01)
    for role, mean in [("input", 229.7), ("output", 203.1)]:
        x = parse_length("sharegpt", role).sample(200_000, rng)
        assert x.mean() == pytest.approx(mean, rel=0.01) and x.min() >= 4 and x.max() <= 1024
    assert SHAREGPT["input"]._clipped_mean(SHAREGPT["input"].mu()) == pytest.approx(229.7)
    # expected_tokens (plan serve's offered load) is the distribution's mean, clipping included
    for spec in ("64", "uniform:1:100", "normal:500:50", "normal:20:40", "lognormal:200:0.8", "sharegpt"):
        dist = parse_length(spec, "output")
        assert dist.sample(400_000, rng).mean() == pytest.approx(dist.expected_tokens(), rel=0.01), spec
    gaps = np.diff(arrival_times_s(200_000, 4.0, parse_arrival_cv("gamma:2"), rng))
    assert gaps.mean() == pytest.approx(0.25, rel=0.02) and gaps.std() / gaps.mean() == pytest.approx(2, rel=0.03)
    gaps = np.diff(arrival_times_s(200_000, 4.0, parse_arrival_cv("poisson"), rng))
    assert gaps.std() / gaps.mean() == pytest.approx(1, rel=0.02)
    assert arrival_times_s(5, math.inf, 1.0, rng).tolist() == [0.0] * 5


@pytest.mark.parametrize("spec", ["uniform:5", "uniform:9:3", "normal:x:1", "lognormal:100:0", "zipf:1",
                                  "0", "20000000", "1.5"])
def test_bad_length_specs_are_one_line_errors(spec):
    with pytest.raises(AisimError) as e:
        parse_length(spec, "input")
    assert "\n" not in str(e.value) and spec in str(e.value)


def test_seeded_workloads_repeat_and_rate_does_not_change_lengths():
    a = run_serving(ServeRequest(num_requests=50, rate_per_s=2.0, seed=9), H100_7B, ENGINE).requests
    b = run_serving(ServeRequest(num_requests=50, rate_per_s=8.0, seed=9), H100_7B, ENGINE).requests
    assert (a.input_tokens == b.input_tokens).all() and (a.output_tokens == b.output_tokens).all()
    assert a.arrival_s[-1] > b.arrival_s[-1]


def test_trace_reader_csv_jsonl_and_one_line_errors(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("arrival_s,input_tokens,output_tokens\n0.5,10,5\n0.1,20,7\n")
    wl = read_trace(good)
    # times count from the first arrival (a log's epoch timestamps are not years of idle time)
    assert wl.arrival_s.tolist() == pytest.approx([0.0, 0.4]) and wl.input_tokens.tolist() == [20, 10]
    assert wl.offset_s == 0.1
    epoch = tmp_path / "epoch.csv"
    epoch.write_text("arrival_s,input_tokens,output_tokens\n1700000000.0,10,5\n1700000000.5,20,7\n")
    assert read_trace(epoch).arrival_s.tolist() == pytest.approx([0.0, 0.5])
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"arrival_s": 0, "input_tokens": 3, "output_tokens": 4}\n\n'
                  '{"arrival_s": 1.5, "input_tokens": 8, "output_tokens": 2}\n')
    assert read_trace(jl).output_tokens.tolist() == [4, 2]
    cases = {"a.csv": ("arrival_s,input_tokens,output_tokens\n0,1,1\n0,x,1\n", ":3: "),
             "b.csv": ("arrival_s,input_tokens\n0,1\n", ":1: "),
             "c.csv": ("arrival_s,input_tokens,output_tokens\n-1,1,1\n", ":2: arrival_s"),
             "d.csv": ("arrival_s,input_tokens,output_tokens\n0,2.5,1\n", ":2: input_tokens"),
             "e.jsonl": ('{"arrival_s": 0, "input_tokens": 1, "output_tokens": 1}\n[1,2]\n', ":2: "),
             "f.jsonl": ('{"arrival_s": 0, "input_tokens": 1}\n', ":1: missing output_tokens"),
             "g.csv": ("arrival_s,input_tokens,output_tokens\n", "no requests"),
             "h.txt": ("", "must end in .csv or .jsonl")}
    for name, (text, expected) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(AisimError) as e:
            read_trace(path)
        assert expected in str(e.value) and "\n" not in str(e.value), name


def test_trace_request_runs_and_writes_per_request_csv(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,100,1\n0.2,100,30\n0.4,199999,5\n")
    seen = []
    out = run_serving(ServeRequest(trace_path=trace), H100_7B, ENGINE, progress=lambda d, t: seen.append((d, t)))
    assert out.result.completed == 2 and out.result.failed == 1 and seen[-1] == (3, 3)
    assert out.result.mean_tpot_ms > 0  # only the 30-token request has a TPOT
    path = tmp_path / "requests.csv"
    write_requests_csv(out.requests, path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 3 and rows[0]["tpot_ms"] == "" and rows[2]["ttft_ms"] == ""
    assert float(rows[1]["e2el_ms"]) == pytest.approx(out.requests.e2el_ms[1], abs=1e-5)


def test_bad_requests_and_engine_configs_are_one_line_aisim_errors():
    with pytest.raises(AisimError):
        ServeRequest(input_len="uniform:1")
    with pytest.raises(AisimError):
        ServeRequest(arrival="gamma:0")
    for model, data in [(ServeRequest, {"rate_per_s": 0}), (ServeRequest, {"num_requests": 10**8}),
                        (EngineConfig, {"num_kv_blocks": 0})]:
        with pytest.raises(AisimError) as e:
            validated(model, data)
        assert "\n" not in str(e.value)
    with pytest.raises(AisimError, match="max_num_batched_tokens"):
        EngineConfig(num_kv_blocks=10, max_num_seqs=512, max_num_batched_tokens=256)
    with pytest.raises(AisimError, match="kv_bytes_per_token"):
        EngineConfig(num_kv_blocks=10, preemption_mode="swap")
    with pytest.raises(AisimError, match="block_sz"):
        simulate_serving(ServeRequest(num_requests=2, engine_overrides={"block_sz": 8}), H100_7B, ENGINE)
    with pytest.raises(AisimError):
        LinearStepTimer(base_s=-1.0)


def _reference_vllm(wl: Workload, timer, cfg: EngineConfig):
    """Brute-force vLLM v1 FCFS recompute scheduler: every request visited every step, running list in admission
    order (vllm/v1/core/sched/scheduler.py `schedule`). Returns each step's shape and each request's token times."""
    from collections import deque
    reqs = [{"a": a, "L": n_in, "O": n_out, "g": 0, "c": 0, "b": 0, "tok": [], "dec": False}
            for a, n_in, n_out in zip(wl.arrival_s.tolist(), wl.input_tokens.tolist(), wl.output_tokens.tolist())]
    bs, free, t, nxt, waiting, running, shapes = cfg.block_size, cfg.num_kv_blocks, 0.0, 0, deque(), [], []
    while True:
        while nxt < len(reqs) and reqs[nxt]["a"] <= t:
            waiting.append(reqs[nxt])
            nxt += 1
        if not running and not waiting:
            if nxt == len(reqs):
                return shapes, [r["tok"] for r in reqs]
            t = reqs[nxt]["a"]
            continue
        budget, sched, preempted, i = cfg.max_num_batched_tokens, [], False, 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r["L"] + r["g"] - r["c"], budget)
            need = -(-(r["c"] + n) // bs) - r["b"]
            while need > free:
                v = running.pop()
                free, v["b"], v["c"], v["dec"], preempted = free + v["b"], 0, 0, False, True
                waiting.appendleft(v)
                if v is r:
                    break
            if any(w is r for w in waiting):
                break  # it preempted itself
            r["b"] += need
            free -= need
            sched.append((r, n))
            budget -= n
            i += 1
        while not preempted and waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            n = min(r["L"] + r["g"], budget)
            if -(-n // bs) > free:
                break
            waiting.popleft()
            running.append(r)
            r["b"] = -(-n // bs)
            free -= r["b"]
            sched.append((r, n))
            budget -= n
        dec = [(r, n) for r, n in sched if r["dec"]]
        pre = [(r, n) for r, n in sched if (r, n) not in dec]
        shape = BatchShape(sum(n for _, n in pre), float(sum(n * (r["c"] + n) for r, n in pre)), len(pre),
                           len(dec), float(sum(r["c"] + 1 for r, _ in dec)), float(sum(r["c"] + n for r, n in pre)))
        shapes.append(shape)
        t += timer.step_time_s(shape)
        for r, n in sched:
            r["c"] += n
            if r["c"] == r["L"] + r["g"]:
                r["g"] += 1
                r["dec"] = True
                r["tok"].append(t)
                if r["g"] == r["O"]:
                    running.remove(r)
                    free += r["b"]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_aggregated_scheduler_matches_brute_force_vllm_schedule(seed):
    rng = np.random.default_rng(seed)
    n = 60
    # 48 blocks x 8 = 384 KV tokens; every request fits alone (at most 250 + 130 - 1 tokens), a few at once do not
    wl = workload(np.cumsum(rng.exponential(0.02, n)), rng.integers(1, 250, n), rng.integers(1, 130, n))
    cfg = EngineConfig(num_kv_blocks=48, block_size=8, max_num_seqs=16, max_num_batched_tokens=256)
    timer = RecordingTimer(H100_7B)
    run_ = simulate(wl, timer, cfg)
    ref_shapes, ref_tokens = _reference_vllm(wl, H100_7B, cfg)
    assert timer.shapes == ref_shapes
    from aisim.studies.serve.metrics import token_times
    times, owner = token_times(run_)
    for rid, ref in enumerate(ref_tokens):
        assert times[owner == rid].tolist() == pytest.approx(ref, rel=1e-12)
    assert summarize(run_, [99])[0].num_preemptions > 0


def test_sliding_window_layers_hold_at_most_the_window():
    # one full-attention and one sliding layer, blocks of 4 tokens, the sliding layer keeps 2 blocks per request:
    # a request of 40 + 1 tokens holds 10 + 2 pool blocks (one block = 4 tokens of one layer), not 10 + 10
    engine = EngineConfig(num_kv_blocks=12, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                          full_groups=1, sliding_groups=1, sliding_window_blocks=2)
    assert engine.units(10) == 12 and engine.units(1) == 2 and engine.units(2) == 4
    result, _ = run(workload([0.0], [40], [1]), H100_7B, engine)
    assert result.completed == 1 and result.kv_cache_peak_utilization == pytest.approx(1.0)
    result, _ = run(workload([0.0], [41], [1]), H100_7B, engine)
    assert result.failed_reasons == {"kv_capacity": 1}
    # the same pool as one group of both layers (no window): 6 blocks of 4 tokens, the 40-token request is rejected
    full = EngineConfig(num_kv_blocks=6, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    assert run(workload([0.0], [40], [1]), H100_7B, full)[0].failed_reasons == {"kv_capacity": 1}


def test_sliding_window_pool_runs_more_requests_at_once_and_every_one_completes():
    # 8 requests of 2000 + 300 tokens (144 blocks of 16 at their peak) on 2 layers' worth of 4000 tokens: with both
    # layers full-attention one request fits at a time (the second's growth preempts it); with one layer windowed
    # at 17 blocks a request holds 144 + 17 of the 500 per-layer blocks, so three run at once and none is preempted
    common = dict(block_size=16, max_num_seqs=64, max_num_batched_tokens=4096)
    full = EngineConfig(num_kv_blocks=250, **common)
    windowed = EngineConfig(num_kv_blocks=500, full_groups=1, sliding_groups=1, sliding_window_blocks=17, **common)
    wl = workload(np.zeros(8), np.full(8, 2000), np.full(8, 300))
    (r_full, _), (r_win, t_win) = run(wl, H100_7B, full), run(wl, H100_7B, windowed)
    assert r_full.completed == r_win.completed == 8 and (t_win.tokens_emitted == t_win.output_tokens).all()
    assert r_full.mean_running_batch_size < 1.1 and r_full.num_preemptions > 0
    assert 2.5 < r_win.mean_running_batch_size <= 3 and r_win.num_preemptions == 0
    assert r_win.output_throughput > 2 * r_full.output_throughput


def test_sliding_layout_of_shipped_windowed_models():
    """KV groups of one type and equal size (the gcd of the type counts), and the blocks a sliding group holds per
    decoding request: vLLM cdiv(window - 1, block_size) + 1; transformers CB ceil(window / block_size); a model
    without windows is one group; Qwen2's use_sliding_window false is none."""
    from aisim.scenario import scenario
    from aisim.studies.serve.run import sliding_layout

    assert sliding_layout(scenario("gpt-oss-20b", "h100", runtime="vllm"), 24, 16) == (1, 1, 9)
    assert sliding_layout(scenario("gpt-oss-20b", "h100", runtime="transformers-cb"), 24, 16) == (1, 1, 8)
    assert sliding_layout(scenario("Mistral-7B-v0.1", "h100", runtime="vllm"), 32, 16) == (0, 1, 257)
    assert sliding_layout(scenario("Meta-Llama-3-8B", "h100", runtime="vllm"), 32, 16) == (1, 0, 0)
    assert sliding_layout(scenario("Qwen2.5-7B", "h100", runtime="vllm"), 28, 16) == (1, 0, 0)


def test_windowed_layers_attend_over_at_most_the_window():
    from aisim.studies.serve.timer import windowed

    shape = BatchShape(prefill_tokens=512, prefill_attn_pairs=512 * 3000.0, prefill_seqs=1, decode_seqs=10,
                       decode_ctx_tokens=10 * 5000.0, prefill_ctx_tokens=3000.0)
    assert windowed(shape, 1024) == BatchShape(512, 512 * 1024.0, 1, 10, 10 * 1024.0, 1024.0 + 512)
    assert windowed(shape, 100_000) == shape


def test_num_gpu_blocks_override_counts_engine_blocks_of_one_kv_group():
    """--num-gpu-blocks-override sets the engine's blocks; with windowed layers an engine block is one KV group
    (transformers: layers of one type in groups of the gcd of the type counts), so the hybrid Qwen2 variant's 160
    blocks hold half the layers' memory of the full model's 160. More blocks than memory: "does not fit"."""
    from aisim.errors import AisimError
    from aisim.scenario import scenario
    from aisim.studies.serve.run import engine_config

    full = scenario("validation/harness/configs/qwen2.5-1.5b.json", "h100", runtime="transformers-cb", dtype="bf16")
    hybrid = scenario("validation/harness/configs/qwen2.5-1.5b-sw256.json", "h100", runtime="transformers-cb",
                      dtype="bf16")
    cfg, cap = engine_config(full, {"num_gpu_blocks_override": 160, "block_size": 256})
    assert (cfg.num_kv_blocks, cfg.full_groups, cfg.sliding_groups, cap.tokens) == (160, 1, 0, 160 * 256)
    cfg, cap = engine_config(hybrid, {"num_gpu_blocks_override": 160, "block_size": 256})
    assert (cfg.num_kv_blocks, cfg.full_groups, cfg.sliding_groups, cfg.sliding_window_blocks) == (160, 1, 1, 1)
    assert cap.tokens == 80 * 256
    default, _ = engine_config(hybrid, {"block_size": 256})
    plain, _ = engine_config(full, {"block_size": 256})
    assert default.num_kv_blocks == pytest.approx(2 * plain.num_kv_blocks, rel=0.01)   # the same memory
    with pytest.raises(AisimError, match="--num-gpu-blocks-override"):
        engine_config(full, {"num_gpu_blocks_override": 0})
    with pytest.raises(AisimError, match="does not fit: --num-gpu-blocks-override"):
        engine_config(full, {"num_gpu_blocks_override": 10 * plain.num_kv_blocks, "block_size": 256})


def test_longest_request_of_a_windowed_pool_and_the_timer_reads_the_window():
    engine = EngineConfig(num_kv_blocks=120, block_size=16, max_num_batched_tokens=256, full_groups=1,
                          sliding_groups=1, sliding_window_blocks=2)
    assert engine.max_request_tokens() == (120 - 2) * 16       # the full group's blocks once the window is held
    every_layer_windowed = engine.model_copy(update={"full_groups": 0})
    assert every_layer_windowed.max_request_tokens() is None
    assert EngineConfig(num_kv_blocks=120, block_size=16).max_request_tokens() == 120 * 16
    # vLLM's windowed groups also hold the prompt chunk (256 tokens: 16 blocks) while it is computed
    chunked = engine.model_copy(update={"sliding_chunk_blocks": True})
    assert chunked.max_request_tokens() == (120 - 2 - 16) * 16
    assert chunked.peak_units(chunked.max_request_tokens()) <= 120 < chunked.peak_units(chunked.max_request_tokens() + 1)
    # gpt-oss-20b (half its layers windowed at 128): a decode step over long contexts costs the windowed layers
    # 128 keys each, so its attention is about half the same model's without windows
    from aisim.scenario import scenario
    from aisim.studies.serve.timer import StepCostTimer

    sc = scenario("gpt-oss-20b", "h100", runtime="vllm", dtype="bf16")
    windowed_timer = StepCostTimer(sc, 256)
    plain = StepCostTimer(sc, 256)
    plain._window = None
    shape = BatchShape(0, 0.0, 0, 64, 64 * 16384.0, 0.0)
    assert windowed_timer._attention_s(shape) == pytest.approx(0.5 * plain._attention_s(shape), rel=0.05)


def test_vllm_windowed_layers_hold_the_prompt_chunk_while_it_is_computed():
    # vLLM gives a windowed layer the window plus the scheduled chunk (SlidingWindowSpec.max_memory_usage_bytes):
    # a 40-token prompt in one chunk holds 10 + min(10, 2 + 10) blocks while it is computed, then 10 + 2
    common = dict(block_size=4, max_num_seqs=4, full_groups=1, sliding_groups=1, sliding_window_blocks=2)
    vllm = EngineConfig(num_kv_blocks=14, max_num_batched_tokens=64, sliding_chunk_blocks=True, **common)
    ring = vllm.model_copy(update={"sliding_chunk_blocks": False})
    assert vllm.units(10, 40) == 20 and vllm.units(10) == 12 and ring.units(10, 40) == 12
    assert run(workload([0.0], [40], [1]), H100_7B, vllm)[0].failed_reasons == {"kv_capacity": 1}
    assert run(workload([0.0], [40], [1]), H100_7B, ring)[0].completed == 1
    # in chunks of 8 tokens a request of 40 + 4 tokens peaks at 11 + (2 + 2) blocks (its reject check), and holds
    # the steady 11 + 2 once decoding: 15 blocks serve it, 14 do not
    chunked = vllm.model_copy(update={"max_num_batched_tokens": 8, "num_kv_blocks": 15})
    assert chunked.units(11, 8) == 15
    result, table = run(workload([0.0, 0.0], [40, 8], [4, 4]), H100_7B, chunked)
    assert result.completed == 2 and (table.tokens_emitted == table.output_tokens).all()
    tight = chunked.model_copy(update={"num_kv_blocks": 14})
    assert run(workload([0.0], [40], [4]), H100_7B, tight)[0].failed_reasons == {"kv_capacity": 1}


class BuildingTimer(RecordingTimer):
    """A LinearStepTimer whose engine builds an attention graph per new (queries, keys) pair, as cuDNN SDPA under
    transformers CB does (StepCostTimer.graph_build_s / attention_shapes)."""

    graph_build_s = 0.05
    idle_power_w = 100.0

    def attention_shapes(self, shape: BatchShape):
        return ((shape.tokens, round(shape.decode_ctx_tokens + shape.prefill_ctx_tokens)),)


def test_attention_graph_is_built_once_per_shape_per_replica_run():
    """Two waves of identical requests: the second wave's steps repeat the first wave's shapes, so only the first
    wave pays the build; two replicas each pay their own."""
    inner = LinearStepTimer(base_s=5e-3, per_token_s=1e-6)
    engine = EngineConfig(num_kv_blocks=8, block_size=16, max_num_seqs=4, max_num_batched_tokens=256)
    timer = BuildingTimer(inner)
    runs = simulate(workload([0.0] * 8, [32] * 8, [6] * 8), timer, engine)
    shapes = [(s.tokens, round(s.decode_ctx_tokens + s.prefill_ctx_tokens)) for s in timer.shapes]
    steps = np.diff([0.0, *runs.replicas[0].step_end_s])
    plain = np.array([inner.step_time_s(s) for s in timer.shapes])
    new = np.array([shape not in shapes[:i] for i, shape in enumerate(shapes)])
    assert new.sum() < len(shapes) and new[0]          # the second wave repeats the first wave's shapes
    assert np.allclose(steps, plain + 0.05 * new)
    assert runs.replicas[0].energy_j == pytest.approx(sum(inner.step_energy_j(s) for s in timer.shapes)
                                                      + 0.05 * new.sum() * 100.0)
    two = BuildingTimer(inner)
    runs2 = simulate(workload([0.0] * 16, [32] * 16, [6] * 16), two, engine, replicas=2)
    assert [r.step_end_s for r in runs2.replicas] == [runs.replicas[0].step_end_s] * 2


def test_windowed_model_attention_shapes_are_unique_and_clip_to_the_window():
    """StepCostTimer.attention_shapes for gpt-oss-20b (half its layers windowed at 128): one shape while every
    context is inside the window, two (full, clipped) beyond it; a replica builds each once."""
    from aisim.scenario import scenario
    from aisim.studies.serve.timer import StepCostTimer

    timer = StepCostTimer(scenario("gpt-oss-20b", "h100", dtype="bf16", runtime="transformers-cb"), 256)
    assert timer.graph_build_s > 0 and timer.idle_power_w > 0
    assert timer.attention_shapes(BatchShape(100, 100.0 * 100, 1, 0, 0.0, 100.0)) == ((100, 100),)
    assert timer.attention_shapes(BatchShape(0, 0.0, 0, 4, 4 * 1000.0)) == ((4, 4000), (4, 4 * 128))


def test_prefill_slack_counts_in_the_capacity_check():
    """A request whose prompt needs the slack's extra block is rejected up front, not left to block the queue."""
    engine = EngineConfig(num_kv_blocks=4, block_size=256, max_num_seqs=8, max_num_batched_tokens=4096,
                          prefill_slack_tokens=2)
    runs = simulate(workload([0.0, 0.0], [1024, 512], [1, 8]), RecordingTimer(LinearStepTimer(base_s=1e-3)), engine)
    assert [r.reject_reason for r in runs.requests] == ["kv_capacity", None]
    assert runs.requests[1].finish_s is not None


def test_transformers_cb_prefill_allocation_leaves_room_for_two_tokens():
    """transformers CB gives a 1024-token prompt 5 blocks of 256 (floor((1024 + 1) / 256) + 1), vLLM's cdiv 4: on
    160 blocks, 32 such requests run at once, not 40."""
    wl = workload([0.0] * 64, [1024] * 64, [64] * 64)
    for slack, expected in ((2, 32), (0, 40)):
        engine = EngineConfig(num_kv_blocks=160, block_size=256, max_num_seqs=1024, max_num_batched_tokens=65536,
                              prefill_slack_tokens=slack)
        timer = RecordingTimer(LinearStepTimer(base_s=1e-3))
        simulate(wl, timer, engine)
        assert timer.shapes[0].prefill_seqs == expected
