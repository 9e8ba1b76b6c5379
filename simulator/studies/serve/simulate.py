"""The event loop: replicas advance step by step, a router hands each arrival to one replica.

Time on a replica: a step planned at clock t (with every request that arrived by t) lasts
    dt = timer.step_time_s(shape) + scheduler_overhead_s + swap_bytes / swap_bandwidth_bytes_per_s
           + graph_build_s x (attention shapes of the step this replica has not run before)
and its tokens are emitted at t + dt. The last term is an engine whose attention kernel builds an execution graph
per exact shape and keeps it for the engine's lifetime (cuDNN SDPA under transformers CB: the timer's graph_build_s
and attention_shapes; PyTorch aten/src/ATen/native/cudnn/MHA.cpp, MHAParams holds the sizes and strides,
MHAGraphCache is a thread_local unordered_map without eviction); a replica's run starts with none built, and the
GPU waits at its waiting power meanwhile. vLLM v1 can overlap the CPU scheduling of step k+1 with the GPU work of
step k (--async-scheduling); pass the non-overlapped part as scheduler_overhead_s. An idle replica jumps to its
next arrival. The first output token comes from the step that finishes the prompt (vllm/v1/core/sched/
scheduler.py `update_from_output`), each later token from one decode step.

Routers (requests are routed on arrival, never moved):
  round-robin   request i (in arrival order) to replica i mod N;
  least-loaded  to the replica with the fewest outstanding requests (routed, not finished; waiting, running or
                swapped) at the arrival time; ties go to the lowest replica index. Requests, not tokens: what a
                front end can count without knowing output lengths.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from aisim.errors import AisimError

from .engine import EngineConfig, ReplicaScheduler, RequestState
from .requests import Workload
from .steptime import BatchShape, StepTimer

ProgressFn = Callable[[int, int], None]  # (requests finished or rejected, total requests)
ROUTERS = ("round-robin", "least-loaded")


@dataclass
class _Progress:
    total: int
    fn: ProgressFn | None
    done: int = 0
    _next: int = 0
    _reported: int = -1

    def add(self, n: int) -> None:
        self.done += n
        if self.fn is not None and self.done >= self._next:
            self._report()

    def _report(self) -> None:
        self.fn(self.done, self.total)
        self._reported = self.done
        self._next = self.done + max(1, self.total // 500)

    def finish(self) -> None:
        if self.fn is not None and self._reported != self.done:
            self._report()


@dataclass
class ReplicaStats:
    """What one replica's run leaves besides the requests' own records."""

    index: int
    num_kv_blocks: int
    step_end_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)          # each step's duration (busy seconds)
    step_energy_j: list[float] = field(default_factory=list)   # each step's energy, graph builds included
    energy_j: float = 0.0
    idle_power_w: float = 0.0    # the replica's GPUs while they wait for work or for the host (timer.idle_power_w)
    in_system_area: float = 0.0  # integral of (requests in the replica) dt over its steps, request-seconds
    batch_seqs_sum: int = 0
    work_steps: int = 0          # steps with the replica's own work (not a lockstep group's dummy batches)
    num_preemptions: int = 0
    prefix_cache_hit_tokens: int = 0
    peak_used_blocks: int = 0


class _Unit:
    """What steps on its own clock: a replica, or a lockstep group of them. ``next_start_s`` (when its next step
    would start: None with nothing to run) and ``step_once`` (run that step) are each kind's; advancing is shared."""

    clock_s: float

    def next_start_s(self) -> float | None:
        raise NotImplementedError

    def step_once(self) -> None:
        raise NotImplementedError

    def advance(self, until_s: float) -> None:
        """Run the steps that start before until_s."""
        while (start := self.next_start_s()) is not None and start < until_s:
            self.step_once()


class _Runner(_Unit):
    """One replica driven in time: its scheduler, its clock, the requests routed to it but not yet seen."""

    def __init__(self, index: int, cfg: EngineConfig, timer: StepTimer, progress: _Progress):
        self.sched = ReplicaScheduler(cfg)
        self.timer, self.progress = timer, progress
        self.overhead_s = cfg.scheduler_overhead_s
        self.build_s = getattr(timer, "graph_build_s", 0.0)
        # a timer written for the per-GPU waiting_power_w (before idle_power_w): its replica of one GPU
        self.build_w = getattr(timer, "idle_power_w", getattr(timer, "waiting_power_w", 0.0))
        self.built: set = set()      # the attention shapes this replica has built a graph for
        self.s_per_swap_byte = 1.0 / cfg.swap_bandwidth_bytes_per_s
        self.stats = ReplicaStats(index, cfg.num_kv_blocks, idle_power_w=self.build_w)
        self.pending: deque[RequestState] = deque()
        self.clock_s = 0.0
        self.outstanding = 0
        self.last_finished = 0

    def push(self, r: RequestState) -> None:
        self.pending.append(r)
        self.outstanding += 1

    def load_at(self, t_s: float) -> int:
        """Outstanding requests at t_s: those finishing in a step that ends after t_s still count."""
        return self.outstanding + (self.last_finished if self.clock_s > t_s else 0)

    def _ingest(self) -> None:
        pending, sched, clock = self.pending, self.sched, self.clock_s
        while pending and pending[0].arrival_s <= clock:
            if not sched.enqueue(pending.popleft()):
                self.outstanding -= 1
                self.progress.add(1)

    def next_start_s(self) -> float | None:
        """Now if it has work, else its next routed request's arrival; None with neither."""
        self._ingest()
        if self.sched.has_work():
            return self.clock_s
        return max(self.pending[0].arrival_s, self.clock_s) if self.pending else None

    def step_once(self) -> None:
        """Run exactly one step: now if there is work, else at the next routed request's arrival."""
        start = self.next_start_s()
        if start is None:
            return
        self.clock_s = start
        self._ingest()
        if not self.sched.has_work():         # rejected on arrival
            return
        k, dt, energy = self.plan_step()
        self.end_step(k, dt, energy, dt)

    def plan_step(self, shape: BatchShape | None = None) -> tuple[int, float, float]:
        """Schedule the next step (or cost ``shape``, a dummy step of an idle rank): (its index, seconds, joules)."""
        sched, timer = self.sched, self.timer
        k = len(self.stats.step_end_s)
        work = shape is None
        if work:
            shape = sched.schedule(k)
        dt = timer.step_time_s(shape) + self.overhead_s + (sched.swap_bytes * self.s_per_swap_byte if work else 0.0)
        energy = timer.step_energy_j(shape)
        if self.build_s:
            new = [key for key in timer.attention_shapes(shape) if key not in self.built]
            if new:
                self.built.update(new)
                dt += self.build_s * len(new)
                energy += self.build_s * len(new) * self.build_w
        if work:
            self.stats.batch_seqs_sum += shape.prefill_seqs + shape.decode_seqs
        return k, dt, energy

    def end_step(self, k: int, own_s: float, energy: float, dt: float, worked: bool = True) -> None:
        """Record step k lasting dt (own_s of it this replica's own work, the rest waiting at the waiting power for
        the ranks it steps with) and complete its requests' tokens."""
        stats, sched = self.stats, self.sched
        energy += max(dt - own_s, 0.0) * self.build_w
        stats.energy_j += energy
        stats.step_energy_j.append(energy)
        stats.step_s.append(dt)
        stats.in_system_area += sched.in_system() * dt
        self.clock_s += dt
        stats.step_end_s.append(self.clock_s)
        stats.work_steps += worked
        finished = sched.complete(k, self.clock_s) if worked else 0
        self.last_finished = finished
        if finished:
            self.outstanding -= finished
            self.progress.add(finished)

    def close(self) -> ReplicaStats:
        self.stats.num_preemptions = self.sched.num_preemptions
        self.stats.prefix_cache_hit_tokens = self.sched.cache_hit_tokens
        self.stats.peak_used_blocks = self.sched.peak_used_blocks
        return self.stats


@dataclass
class SimRun:
    """Raw outcome: every request's record, the replica of each, and each replica's step timeline."""

    requests: list[RequestState]
    replica_of: np.ndarray
    replicas: list[ReplicaStats]
    router: str
    max_concurrency: int | None = None


def make_requests(workload: Workload) -> list[RequestState]:
    arrival, inp, out = workload.arrival_s.tolist(), workload.input_tokens.tolist(), workload.output_tokens.tolist()
    return [RequestState(i, a, n_in, n_out) for i, (a, n_in, n_out) in enumerate(zip(arrival, inp, out))]


class _Lockstep(_Unit):
    """Data-parallel ranks that step together (vLLM's data parallel with expert parallelism: every rank runs each
    MoE layer's all-to-all, so a step ends when the slowest rank's does, and a rank without requests runs a dummy
    batch meanwhile: vllm/v1/engine/core.py DPEngineCoreProc.run_busy_loop, execute_dummy_batch). Each rank keeps
    its own scheduler, KV cache and requests; the group has one clock. A wave of steps starts with the first
    request and ends only when no rank has work at a 32nd step of it (_has_global_unfinished_reqs all-reduces
    every WAVE_CHECK_STEPS steps): until then the drained ranks run dummy batches."""

    def __init__(self, members: list[_Runner]):
        self.members = members
        self.wave_steps = 0

    def _wave_over(self) -> bool:
        return not any(m.sched.has_work() for m in self.members) and self.wave_steps % WAVE_CHECK_STEPS == 0

    def _step(self) -> None:
        """One step of the group: each rank its own batch, or the dummy batch where it has none."""
        members = self.members
        busy = [m.sched.has_work() for m in members]
        planned = [m.plan_step(None if b else DUMMY_STEP) for m, b in zip(members, busy)]
        dt = max(p[1] for p in planned)
        self.wave_steps += 1
        for m, b, (k, own_s, energy) in zip(members, busy, planned):
            m.end_step(k, own_s, energy, dt, worked=b)

    @property
    def clock_s(self) -> float:
        return self.members[0].clock_s

    def _ingest(self) -> None:
        for m in self.members:
            m._ingest()

    def next_start_s(self) -> float | None:
        """Now while a wave is on (dummy steps included), else the ranks' next arrival; None with neither."""
        self._ingest()
        if not self._wave_over():
            return self.clock_s
        arrivals = [m.pending[0].arrival_s for m in self.members if m.pending]
        return max(min(arrivals), self.clock_s) if arrivals else None

    def step_once(self) -> None:
        """Run exactly one group step: now if a wave is on, else a new wave at the next arrival."""
        start = self.next_start_s()
        if start is None:
            return
        if self._wave_over():               # between waves: the group's clock moves to the arrival
            self.wave_steps = 0
            for m in self.members:
                m.clock_s = start
            self._ingest()
            if self._wave_over():           # rejected on arrival
                return
        self._step()


WAVE_CHECK_STEPS = 32
# vLLM's dummy batch on an idle data-parallel rank: one token (vllm/v1/worker/gpu_worker.py execute_dummy_batch:
# model_runner._dummy_run(1, uniform_decode=True))
DUMMY_STEP = BatchShape(0, 0.0, 0, 1, 1.0)


def _release_s(r: RequestState, units: list, runners: list[_Runner], limit: int, after_s: float) -> float:
    """When the client sends ``r`` under a cap of ``limit`` requests in flight (vLLM bench's --max-concurrency: an
    asyncio semaphore around each request): at its arrival if fewer are in flight, else at the first finish that
    frees a slot. The client sends in arrival order: never before ``after_s``, the previous request's send. Event
    by event: a replica's step that ends after the candidate time still holds its requests (load_at); the earliest
    such end is the next candidate, unless some replica starts a step before it, which is run first (it may end
    sooner)."""
    t = max(r.arrival_s, after_s)
    for unit in units:
        unit.advance(t)
    while sum(x.load_at(t) for x in runners) >= limit:
        ends = [x.clock_s for x in runners if x.clock_s > t and x.last_finished]
        end = min(ends) if ends else math.inf
        starts = [(s, u) for u in units if (s := u.next_start_s()) is not None and s < end]
        if starts:
            min(starts, key=lambda su: su[0])[1].step_once()
        elif end < math.inf:
            t = end
        else:
            raise AisimError("max_concurrency: requests in flight but no replica with work (a simulator bug)")
    return t


def simulate(workload: Workload, timer: StepTimer, engine: EngineConfig, replicas: int = 1,
             router: str = "round-robin", progress: ProgressFn | None = None, lockstep: int = 1,
             max_concurrency: int | None = None) -> SimRun:
    """Simulate serving the workload on `replicas` identical replicas behind `router`; ``lockstep``: replicas per
    group that steps together (data-parallel ranks of one expert-parallel group), 1 for independent replicas;
    ``max_concurrency``: the client's cap on requests in flight (vLLM bench's --max-concurrency; a request's
    latencies count from when it is sent, its wait in scheduled_s)."""
    if router not in ROUTERS:
        raise AisimError(f"unknown router {router!r}; use one of {', '.join(ROUTERS)}")
    if not 1 <= replicas <= 4096:
        raise AisimError(f"replicas must be in 1..4096, got {replicas}")
    if lockstep < 1 or replicas % lockstep:
        raise AisimError(f"{replicas} replicas do not form groups of {lockstep} data-parallel ranks")
    requests = make_requests(workload)
    tracker = _Progress(len(requests), progress)
    runners = [_Runner(i, engine, timer, tracker) for i in range(replicas)]
    units = runners if lockstep == 1 else [_Lockstep(runners[i:i + lockstep]) for i in range(0, replicas, lockstep)]
    replica_of = np.zeros(len(requests), dtype=np.int64)
    if max_concurrency is not None:
        if max_concurrency < 1:
            raise AisimError(f"max_concurrency must be a positive number of requests, got {max_concurrency}")
        sent = 0.0
        for i, r in enumerate(sorted(requests, key=lambda q: (q.arrival_s, q.rid))):
            r.arrival_s = sent = _release_s(r, units, runners, max_concurrency, sent)
            if router != "round-robin":
                for unit in units:          # every replica at the send: their loads then are current
                    unit.advance(sent)
            best = i % replicas if router == "round-robin" else min(
                range(replicas), key=lambda j: runners[j].load_at(r.arrival_s))
            replica_of[r.rid] = best
            runners[best].push(r)
    elif router == "round-robin" or replicas == 1:
        for r in requests:
            replica_of[r.rid] = r.rid % replicas
            runners[r.rid % replicas].push(r)
    else:
        for r in requests:
            for unit in units:
                unit.advance(r.arrival_s)
            best = min(range(replicas), key=lambda i: runners[i].load_at(r.arrival_s))
            replica_of[r.rid] = best
            runners[best].push(r)
    for unit in units:
        unit.advance(math.inf)
    tracker.finish()
    return SimRun(requests, replica_of, [runner.close() for runner in runners], router, max_concurrency)
