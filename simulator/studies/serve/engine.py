"""One replica's scheduler and KV-block pool, with vLLM v1 semantics.

Each step (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`):
1. Running requests first, in admission order: a decoding request gets one token, a request still in its
   prompt gets the next chunk, min(remaining, long_prefill_token_threshold if > 0, token budget).
   KV slots are allocated for computed + new tokens in blocks of block_size (vllm/v1/core/kv_cache_manager.py
   `KVCacheManager.allocate_slots`: cdiv(tokens, block_size) - held blocks, None when the pool is short).
   When a running request cannot get its blocks, the most recently admitted running request is preempted
   (`self.running.pop()` under the FCFS policy), repeatedly, until the allocation succeeds or the request
   preempted itself, which ends the running pass.
2. If nothing was preempted this step, waiting requests are admitted FCFS while the token budget, max_num_seqs
   and free blocks allow (a request needing more blocks than are free stops admission: `break`, not `continue`).
   Without chunked prefill, a prompt larger than the budget left stops admission too.
Preemption by recompute (vLLM v1's only mode, `_preempt_request`): the request loses its KV, goes to the front
of the waiting queue, and recomputes prompt + generated tokens as one prefill whose last step emits the next
token; with prefix caching (vLLM V1's default) the blocks it freed stay cached in the free pool, least recently
freed evicted first (a request's tail blocks first), and its readmission takes back the cached prefix, at most all
its tokens but one (vllm/v1/core/kv_cache_manager.py `free`, `get_computed_blocks`). Blocks freed before a
preemption are reused before its cached ones, blocks freed after it (finished requests) after them; only the
preempted requests' own prefixes are hits (the simulated prompts share none). Preemption by swap (vLLM v0
vllm/core/scheduler.py `_preempt_by_swap` / `_schedule_swapped`): the
blocks are copied to host memory (cost: blocks * block_size * kv_bytes_per_token / swap bandwidth, added to
the step), the request joins the swapped queue, and swapped requests are resumed before waiting ones when no
preemption happened in the step.

Speed: decoding requests are not visited per step. Each decoding request's context is (step - base), so the sum
of contexts is n_decoding * step - sum(base); its next block need and its last token are heap events.

Known differences from vLLM: decode tokens are scheduled before prefill chunks in a step, the order of
transformers' continuous batching (transformers/generation/continuous_batching/scheduler.py
`FIFOScheduler.schedule_batch`: DECODING, then PREFILLING, then waiting requests); vLLM walks the running list in
admission order, which differs only when long_prefill_token_threshold lets a later request finish its prompt
before an earlier one (without it, the one request left mid-prompt is always the latest admitted; a brute-force
vLLM schedule in tests/test_serve_sim.py matches step for step). Not modelled from transformers: its
safety_margin (no new prefills when free blocks fall under a fraction) and CPU offloading. In swap mode a request preempted during its prompt is recomputed (it has no
output yet), and host swap space is unlimited; a recomputed request longer than max_num_batched_tokens is chunked
even without chunked prefill (vLLM would never schedule it); prefix caching only of preempted requests' own
prefixes and only in pools without sliding-window groups; no speculative decoding.
"""
from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from aisim.errors import AisimError

from .requests import MAX_TOKENS
from .steptime import BatchShape

WAITING, PREFILL, DECODE, SWAPPED, DONE, REJECTED = range(6)


class EngineConfig(BaseModel):
    """One replica's serving-engine settings (vLLM names). num_kv_blocks comes from the caller's memory model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_kv_blocks: int = Field(ge=1, le=1_000_000_000, description="KV-cache blocks on the replica")
    block_size: int = Field(16, ge=1, le=65_536, description="tokens per KV block (vLLM --block-size)")
    max_num_seqs: int = Field(256, ge=1, le=1_000_000, description="running requests at most (--max-num-seqs)")
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_TOKENS,
                                        description="tokens per step at most (--max-num-batched-tokens)")
    enable_chunked_prefill: bool = Field(True, description="split prompts across steps (--enable-chunked-prefill)")
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_TOKENS,
                                              description="cap on one request's prompt tokens per step; 0 = none")
    max_model_len: int | None = Field(None, ge=2, le=2 * MAX_TOKENS,
                                      description="requests with input + output over this are rejected")
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    enable_prefix_caching: bool = Field(False, description="recompute preemption keeps the victim's full computed "
                                        "blocks cached in the free pool until reused; readmission takes them back "
                                        "(vLLM V1's default prefix caching; full-attention pools only)")
    swap_bandwidth_bytes_per_s: float = Field(25e9, gt=0, le=1e13, description="host<->device copy bandwidth")
    kv_bytes_per_token: float = Field(0.0, ge=0, le=1e10, description="KV bytes of one token, all layers")
    full_groups: int = Field(1, ge=0, le=100_000, description="KV groups of full-attention layers; one block of the "
                             "pool is block_size tokens of one group (1 and no sliding groups: all layers)")
    sliding_groups: int = Field(0, ge=0, le=100_000, description="KV groups of sliding-window layers")
    sliding_window_blocks: int = Field(0, ge=0, le=1_000_000_000, description="blocks a sliding-window group "
                                       "holds per request at most (vLLM: cdiv(window - 1, block_size) + 1)")
    sliding_chunk_blocks: bool = Field(False, description="a sliding-window group also holds the blocks of the "
                                       "prompt chunk a step computes, freed once it is computed (vLLM)")
    prefill_slack_tokens: int = Field(0, ge=0, le=65_536, description="room a prompt chunk's block allocation "
                                      "leaves beyond the chunk's tokens: transformers CB allocates "
                                      "floor((tokens - free + 1) / block_size) + 1 blocks when a chunk does not fit "
                                      "its free slots (2); vLLM cdiv (0)")
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    scheduler_overhead_s: float = Field(0.0, ge=0, le=10.0, description="CPU time per step, added to each step")

    @model_validator(mode="after")
    def _consistent(self) -> EngineConfig:
        if self.scheduling_policy == "priority":
            raise AisimError("scheduling_policy 'priority' is not modelled yet; use 'fcfs'")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise AisimError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({self.max_num_seqs}), as vLLM requires; raise it or lower max_num_seqs")
        if self.preemption_mode == "swap" and self.kv_bytes_per_token <= 0:
            raise AisimError("preemption_mode 'swap' needs kv_bytes_per_token > 0 to cost the copies")
        if self.full_groups + self.sliding_groups < 1 or (self.sliding_groups and self.sliding_window_blocks < 1):
            raise AisimError("a KV pool needs at least one layer group, and sliding-window groups a window of at "
                             "least one block")
        return self

    def peak_units(self, tokens: int) -> int:
        """Pool blocks a request of ``tokens`` KV tokens (input + output - 1) holds at its largest, with a prompt
        chunk in flight (a recompute after preemption prefills it all, with prefill_slack_tokens of room), as vLLM
        sizes a windowed layer for a request of max_model_len (SlidingWindowSpec.max_memory_usage_bytes)."""
        chunk = min(tokens, self.max_num_batched_tokens, self.long_prefill_token_threshold or tokens)
        # a prompt chunk's allocation leaves prefill_slack_tokens of room (a recompute near the end re-prefills all)
        return self.units(_cdiv(tokens + self.prefill_slack_tokens, self.block_size), chunk)

    def max_request_tokens(self) -> int | None:
        """The most KV tokens (input + output - 1) of a request the pool holds alone (peak_units); None when every
        layer is windowed and any length fits."""
        if self.full_groups == 0 and self.peak_units(MAX_TOKENS) <= self.num_kv_blocks:
            return None
        lo, hi = 0, 2 * MAX_TOKENS
        while lo < hi:          # the largest token count whose peak fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.peak_units(mid) <= self.num_kv_blocks else (lo, mid - 1)
        return lo

    def units(self, blocks: int, chunk_tokens: int = 0) -> int:
        """Pool blocks held by a request whose full-attention groups hold ``blocks`` token blocks: the sliding
        groups hold at most sliding_window_blocks each (vllm/v1/core/single_type_kv_cache_manager.py
        SlidingWindowManager.remove_skipped_blocks frees the blocks wholly before the window; transformers'
        SlidingAttentionCacheAllocator caps a request at ceil(window / block_size) blocks)."""
        window = self.sliding_window_blocks
        if chunk_tokens and self.sliding_chunk_blocks:   # vLLM SlidingWindowSpec: the window plus the chunk
            window += _cdiv(chunk_tokens, self.block_size)
        return self.full_groups * blocks + self.sliding_groups * min(blocks, window)


class RequestState:
    """One request's progress. computed = tokens whose KV is in the cache; generated = output tokens emitted;
    segments = flat [first, last, first, last, ...] step indices of the runs of steps that emitted its tokens."""

    __slots__ = ("rid", "arrival_s", "input_tokens", "output_tokens", "state", "generated", "computed", "blocks",
                 "units", "swapped_blocks", "adm", "base", "k_fin", "preemptions", "first_token_s", "finish_s",
                 "segments", "reject_reason", "cached", "scheduled_s")

    def __init__(self, rid: int, arrival_s: float, input_tokens: int, output_tokens: int):
        self.rid, self.arrival_s = rid, arrival_s
        self.scheduled_s = arrival_s    # when the client meant to send it (arrival_s: the send, after a cap's wait)
        self.input_tokens, self.output_tokens = input_tokens, output_tokens
        self.state, self.generated, self.computed, self.blocks, self.swapped_blocks = WAITING, 0, 0, 0, 0
        self.units = 0  # pool blocks held (blocks x the full groups, plus the sliding groups' share)
        self.cached = 0  # after a recompute preemption with prefix caching: its prefix blocks still in the pool
        self.adm = self.base = self.k_fin = -1
        self.preemptions = 0
        self.first_token_s = self.finish_s = None
        self.segments: list[int] = []
        self.reject_reason: str | None = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class ReplicaScheduler:
    """State machine of one replica: waiting / running / swapped queues and the KV-block pool.

    It holds state and mutates it on purpose (a simulator is a state machine); time lives in simulate.py.
    schedule(k) plans step k and returns its BatchShape; complete(k, t_end_s) applies the step's results.
    """

    def __init__(self, cfg: EngineConfig):
        self.cfg, self.bs = cfg, cfg.block_size
        self.free_blocks = cfg.num_kv_blocks
        self.waiting: deque[RequestState] = deque()
        self.swapped: deque[RequestState] = deque()
        self.running: dict[int, RequestState] = {}  # admission order: popitem() is the latest admitted
        self.prefilling: list[RequestState] = []
        self.n_dec = self.sum_base = 0
        self._block_heap: list = []  # (step needing a new block, adm, request)
        self._finish_heap: list = []  # (step emitting the last token, adm, request)
        self._adm = 0
        self.chunks: list[tuple[RequestState, int]] = []
        self.swap_bytes = 0.0
        self.preempted = False
        self.num_preemptions = self.peak_used_blocks = 0
        # prefix caching: the free pool in eviction order (vLLM's free block queue: freed blocks appended, reused from
        # the front), as runs of plain free blocks ([count]) and of a preempted request's cached prefix (the request:
        # its ``cached`` blocks)
        self.cache_hit_tokens = 0
        self._caching = cfg.enable_prefix_caching and cfg.full_groups == 1 and cfg.sliding_groups == 0
        self._pool: deque = deque([[cfg.num_kv_blocks]]) if self._caching else deque()

    # ---- admission control -------------------------------------------------------------------------------
    def reject_reason(self, r: RequestState) -> str | None:
        """Why a request can never run on this replica, or None. Its KV peaks at input + output - 1 tokens."""
        cfg = self.cfg
        if cfg.peak_units(r.input_tokens + r.output_tokens - 1) > cfg.num_kv_blocks:
            return "kv_capacity"
        if cfg.max_model_len is not None and r.input_tokens + r.output_tokens > cfg.max_model_len:
            return "max_model_len"
        if not cfg.enable_chunked_prefill and r.input_tokens > cfg.max_num_batched_tokens:
            return "max_num_batched_tokens"
        return None

    def enqueue(self, r: RequestState) -> bool:
        """Add an arrived request to the waiting queue; False (and state REJECTED) if it can never fit."""
        reason = self.reject_reason(r)
        if reason is not None:
            r.state, r.reject_reason = REJECTED, reason
            return False
        self.waiting.append(r)
        return True

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped)

    def in_system(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.swapped)

    # ---- one step ----------------------------------------------------------------------------------------
    def schedule(self, k: int) -> BatchShape:
        """Plan step k: running requests, then (if nothing was preempted) swapped and waiting ones."""
        self.chunks, self.swap_bytes, self.preempted = [], 0.0, False
        if self._block_heap:
            self._schedule_decodes(k)
        budget = self.cfg.max_num_batched_tokens - self.n_dec
        if self.prefilling:
            budget = self._schedule_prefills(k, budget)
        if not self.preempted:
            if self.swapped:
                budget = self._resume_swapped(k, budget)
            if self.waiting:
                self._admit_waiting(budget)
        used = self.cfg.num_kv_blocks - self.free_blocks
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        tokens = pairs = ctx = 0
        for r, c in self.chunks:
            tokens += c
            pairs += c * (r.computed + c)
            ctx += r.computed + c
        if not self.chunks and not self.n_dec:
            raise RuntimeError(f"internal: step {k} scheduled nothing with {self.in_system()} requests pending")
        return BatchShape(tokens, float(pairs), len(self.chunks), self.n_dec, float(self.n_dec * k - self.sum_base),
                          float(ctx))

    def complete(self, k: int, t_end_s: float) -> int:
        """Apply step k, which ended at t_end_s: finished prompts emit a token, decoders due finish.
        Returns the number of requests that finished."""
        finished = 0
        for r, c in self.chunks:
            r.computed += c
            if r.computed < r.input_tokens + r.generated:
                continue
            r.generated += 1  # the step that completes a prompt emits a token (vLLM update_from_output)
            if r.first_token_s is None:
                r.first_token_s = t_end_s
            r.segments.append(k)
            self.prefilling.remove(r)
            if r.generated >= r.output_tokens:
                r.segments.append(k)
                self._finish(r, t_end_s)
                finished += 1
            else:
                self._enter_decode(r, k + 1)
        heap = self._finish_heap
        while heap and heap[0][0] <= k:
            _, adm, r = heappop(heap)
            if r.adm == adm and r.state == DECODE:
                self._leave_decode(r, k)
                self._finish(r, t_end_s)
                finished += 1
        return finished

    # ---- running requests --------------------------------------------------------------------------------
    def _schedule_decodes(self, k: int) -> None:
        """Allocate the blocks decoding requests need at step k (block-boundary events), preempting if short."""
        heap, needers = self._block_heap, []
        while heap and heap[0][0] <= k:
            _, adm, r = heappop(heap)
            if r.adm == adm and r.state == DECODE:
                needers.append(r)  # popped in (step, admission) order: admission order
        units = self.cfg.units
        grows = [units(r.blocks + 1) - r.units for r in needers]
        if sum(grows) <= self.free_blocks:
            self._take(sum(grows))
            for r in needers:
                self._grant_decode_block(r)
            return
        for r, grow in zip(needers, grows):
            if r.state != DECODE:
                continue  # preempted as a victim of an earlier request
            while self.free_blocks < grow:
                if self._preempt_tail(k) is r:
                    return  # it preempted itself: vLLM ends the running pass
            self._take(grow)
            self._grant_decode_block(r)

    def _grant_decode_block(self, r: RequestState) -> None:
        r.blocks += 1
        r.units = self.cfg.units(r.blocks)
        k_next = r.base + r.blocks * self.bs + 1  # first step whose context exceeds the held slots
        if k_next <= r.k_fin:
            heappush(self._block_heap, (k_next, r.adm, r))

    def _schedule_prefills(self, k: int, budget: int) -> int:
        """The next prompt chunk of each running request still in its prompt, in admission order."""
        for r in list(self.prefilling):
            if budget <= 0:
                break
            if r.state != PREFILL:
                continue
            chunk = self._chunk(r, budget)
            end = r.computed + chunk
            blocks = r.blocks if end <= r.blocks * self.bs else _cdiv(end + self.cfg.prefill_slack_tokens, self.bs)
            held = self.cfg.units(blocks, chunk)
            need = held - r.units
            preempted_self = False
            while need > self.free_blocks:
                if self._preempt_tail(k) is r:
                    preempted_self = True
                    break
            if preempted_self:
                break
            r.blocks, r.units = blocks, held
            self._take(need)
            self.chunks.append((r, chunk))
            budget -= chunk
        return budget

    def _chunk(self, r: RequestState, budget: int) -> int:
        remaining = r.input_tokens + r.generated - r.computed
        threshold = self.cfg.long_prefill_token_threshold
        if 0 < threshold < remaining:
            remaining = threshold
        return min(remaining, budget)

    # ---- swapped and waiting requests --------------------------------------------------------------------
    def _resume_swapped(self, k: int, budget: int) -> int:
        """Swap requests back in, oldest first, while budget, max_num_seqs and free blocks allow."""
        while self.swapped and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            r = self.swapped[0]
            blocks = _cdiv(r.input_tokens + r.generated, self.bs)  # its KV plus the slot of this step's token
            need = self.cfg.units(blocks)
            if need > self.free_blocks:
                break
            self.swapped.popleft()
            self.swap_bytes += self._block_bytes(r.swapped_blocks)
            r.blocks, r.swapped_blocks, r.units = blocks, 0, need
            self._take(need)
            self._admit(r)
            r.segments.append(k)
            self._enter_decode(r, k)
            budget -= 1
        return budget

    def _admit_waiting(self, budget: int) -> None:
        """Admit waiting requests FCFS (vLLM `schedule`, "Next, schedule the WAITING requests")."""
        cfg = self.cfg
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            r = self.waiting[0]
            # a preempted request's prefix still cached: at most all its tokens but one (get_computed_blocks)
            hit = min(r.cached, (r.input_tokens + r.generated - 1) // self.bs) if r.cached else 0
            r.computed = hit * self.bs
            wanted = self._chunk(r, MAX_TOKENS)
            chunk = min(wanted, budget)
            blocks = _cdiv(r.computed + chunk + self.cfg.prefill_slack_tokens, self.bs)
            need = self.cfg.units(blocks, chunk)
            if need > self.free_blocks or (not cfg.enable_chunked_prefill
                                           and budget < wanted <= cfg.max_num_batched_tokens):
                r.computed = 0      # still waiting: nothing of it is computed
                break
            self.waiting.popleft()
            if r.cached:
                spare = r.cached - hit           # cached blocks past the hit (its last token is recomputed)
                self._uncache(r)
                self.free_blocks -= hit          # the hit blocks leave the free pool, evicting nothing
                if spare:
                    self._pool.appendleft([spare])
                self.cache_hit_tokens += r.computed
            r.blocks, r.units = blocks, need
            self._take(need - hit)
            r.state = PREFILL
            self._admit(r)
            self.prefilling.append(r)
            self.chunks.append((r, chunk))
            budget -= chunk

    def _admit(self, r: RequestState) -> None:
        self._adm += 1
        r.adm = self._adm
        self.running[r.rid] = r

    # ---- state changes -----------------------------------------------------------------------------------
    def _enter_decode(self, r: RequestState, k: int) -> None:
        """r decodes from step k on, with r.generated tokens emitted: context at step j is j - base."""
        r.state = DECODE
        steady = self.cfg.units(r.blocks)
        if r.units > steady:   # the last prompt chunk's extra sliding-window blocks, freed (vLLM)
            self._give(r.units - steady)
            r.units = steady
        r.base = k - r.input_tokens - r.generated
        r.k_fin = k + r.output_tokens - r.generated - 1
        self.n_dec += 1
        self.sum_base += r.base
        heappush(self._finish_heap, (r.k_fin, r.adm, r))
        k_need = r.base + r.blocks * self.bs + 1
        if k_need <= r.k_fin:
            heappush(self._block_heap, (k_need, r.adm, r))

    def _leave_decode(self, r: RequestState, k_last: int) -> None:
        """r stops decoding after emitting its token of step k_last."""
        self.n_dec -= 1
        self.sum_base -= r.base
        r.generated = k_last - r.base - r.input_tokens + 1
        r.computed = r.input_tokens + r.generated - 1
        r.segments.append(k_last)

    def _finish(self, r: RequestState, t_end_s: float) -> None:
        r.state, r.finish_s = DONE, t_end_s
        del self.running[r.rid]
        self._give(r.units)
        r.blocks = r.units = 0

    def _block_bytes(self, blocks: int) -> float:
        """Bytes of the KV a request holds with ``blocks`` token blocks (what a swap copies)."""
        cfg = self.cfg
        return cfg.units(blocks) * self.bs * cfg.kv_bytes_per_token / (cfg.full_groups + cfg.sliding_groups)

    def _give(self, n: int, owner: RequestState | None = None) -> None:
        """Free n pool blocks, appended to the free queue (as ``owner``'s cached prefix when given)."""
        self.free_blocks += n
        if not self._caching or n <= 0:
            return
        if owner is not None:
            self._pool.append(owner)
        elif self._pool and isinstance(self._pool[-1], list):
            self._pool[-1][0] += n
        else:
            self._pool.append([n])

    def _take(self, n: int) -> None:
        """Allocate n pool blocks from the front of the free queue, evicting cached prefixes there (tail first)."""
        self.free_blocks -= n
        pool = self._pool
        while n > 0 and pool:
            head = pool[0]
            have = head[0] if isinstance(head, list) else head.cached
            used = min(n, have)
            if isinstance(head, list):
                head[0] -= used
            else:
                head.cached -= used
            n -= used
            if used == have:
                pool.popleft()

    def _uncache(self, r: RequestState) -> None:
        """A readmitted request takes its cached prefix out of the free queue."""
        self._pool.remove(r)
        r.cached = 0

    def _preempt_tail(self, k: int) -> RequestState:
        """Preempt the most recently admitted running request at step k (vLLM FCFS: `self.running.pop()`)."""
        _, victim = self.running.popitem()
        was_decoding = victim.state == DECODE
        if was_decoding:
            self._leave_decode(victim, k - 1)
        else:
            self.prefilling.remove(victim)
        victim.preemptions += 1
        self.num_preemptions += 1
        self.preempted = True
        if was_decoding and self.cfg.preemption_mode == "swap":
            self._give(victim.units)
            self.swap_bytes += self._block_bytes(victim.blocks)
            victim.swapped_blocks, victim.blocks, victim.units, victim.state = victim.blocks, 0, 0, SWAPPED
            self.swapped.append(victim)
        else:
            # its blocks are freed tail first (vLLM frees them in reverse): the ones past its full computed blocks,
            # then, with prefix caching, its cached prefix
            cached = min(victim.computed // self.bs, victim.blocks) if self._caching else 0
            self._give(victim.units - cached)
            victim.cached = cached
            self._give(cached, victim)
            victim.blocks, victim.units, victim.computed, victim.state = 0, 0, 0, WAITING
            self.waiting.appendleft(victim)
        return victim
