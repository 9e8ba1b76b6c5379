"""The serving simulator's step timer, built from aisim's step-cost model of the scenario (no measured step times).

One engine step is one forward over the step's packed tokens. Its cost splits into
  - the dense part (every op but attention) of a forward of N = prefill + decode tokens: traced and costed once at
    N = 1, 2, 4, ... up to the token budget (aisim.step.step_cost of a batch-1 prefill of N tokens, attention rows
    taken out) and interpolated linearly in N: GPU time, host dispatch time and average power;
  - attention, by the engine's kind (runtime ``serving.attention``):
      varlen: each sequence attends to its own context (FlashAttention varlen / paged decode kernels, vLLM):
        prefill FLOPs 4 * heads * head_dim * pairs; decode bytes = contexts x KV bytes per token, read by a
        split-KV (flash-decoding) kernel on the SMs its work tiles fill (:func:`decode_work_tiles`);
      packed-mask: transformers' ``paged|sdpa`` (integrations/sdpa_paged.py, sdpa_attention_paged_forward) runs one
        SDPA over all the step's Q queries and K keys with a block-diagonal [1, 1, Q, K] mask, after the cache
        update reads every request's keys (generation/continuous_batching/cache.py PagedAttentionCache.update:
        2 index_copy_ writes of the new tokens, 2 index_select reads of the K cached keys) and repeat_kv expands
        the K keys to the query heads (sdpa_paged.py repeat_kv, a copy): 4 Q K H d FLOPs per layer (no causal
        skipping), and the grid of the SDPA kernel is ceil(Q / 64) x heads blocks: when that is under the SM count
        the kernel streams the keys with only that many SMs (wave quantisation, no fit);
  - the host: the forward's dispatch (traced) plus the engine's per-layer ops, in parallel with the GPU (the step
    takes the longer of the two), then the engine's per-step host work (batch preparation, sampling), serially.
Energy: the step's time at the dense forward's average power. Values are memoised on a rounded shape key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...cost.efficiency import SDPA_QUERY_BLOCK, masked_attention_efficiency
from ...cost.timeline import host_scale
from ...graph.engine import sliding_windows, windowed_fraction
from ...scenario import Scenario
from ...step import step_cost
from ...units import DTYPE_BYTES
from ...workload import StepShape
from .steptime import BatchShape, share

KEY_ROUND = 64                 # shapes are memoised with contexts rounded to this many tokens

# Split-KV decode as vLLM runs it on Hopper: vLLM v1's FlashAttention backend calls FlashAttention-3
# (vllm/v1/attention/backends/flash_attn.py: get_flash_attn_version() == 3 there) and, with full CUDA graphs (the
# v1 default), caps the splits at _DEFAULT_MAX_NUM_SPLITS_FOR_CUDA_GRAPH = 16 (FlashAttentionMetadataBuilder). FA3
# then splits each sequence's keys dynamically (Dao-AILab/flash-attention hopper/flash_prepare_scheduler.cu 140-161):
# blocks_per_sm = ceil(total key blocks x 1.1 x kv_heads / SMs), splits = clamp(ceil(key blocks / blocks_per_sm),
# 1, cap); one key block is kBlockN keys (hopper/tile_size.h tile_size_fwd_sm90 27-40: a paged cache without TMA
# takes 128 keys for head_dim <= 128, 96 to 192, 80 above); one work tile per sequence x KV head x split (GQA packed,
# hopper/flash_api.cpp get_num_splits 442-471). FlashAttention-2's num_splits_heuristic (csrc/flash_attn/
# flash_api.cpp 281-315) has the same aim: enough splits to fill the SMs.
SPLIT_KV_MAX_SPLITS = 16
SPLIT_KV_MARGIN = 1.1
BEST_DECODE_BYTES = 1e12       # a size beyond every decode curve's last point: its best (largest-size) efficiency


@dataclass(frozen=True)
class ModelDims:
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    element_bytes: float
    # the cache, per token per layer of one GPU: elements (K and V of kv_heads x head_dim, or MLA's shared latent),
    # bytes per element (the --kv-dtype), and the decode FLOPs per cached key
    kv_elements: float = 0.0
    kv_element_bytes: float = 0.0
    decode_flops_per_key: float = 0.0
    prefill_kv_heads: int = 0          # heads of the K and V a prefill's attention reads (MLA: decompressed per head)

    @classmethod
    def of(cls, sc: Scenario) -> "ModelDims":
        c = sc.config
        heads = c.get("num_attention_heads") or c.get("n_head")
        hidden = c.get("hidden_size") or c.get("n_embd")
        kv = c.get("num_key_value_heads") or heads
        layers = c.get("num_hidden_layers") or c.get("n_layer")
        tp = sc.plan.tp
        q_heads, kv_heads = max(heads // tp, 1), max(kv // tp, 1)
        head_dim = c.get("head_dim") or hidden // heads
        rank, rope = c.get("kv_lora_rank"), c.get("qk_rope_head_dim") or 0
        prefill_kv_heads = kv_heads
        if rank:   # MLA: per head, keys of nope + rope and values of v_head_dim (prefill attends over them)
            head_dim = ((c.get("qk_nope_head_dim") or 0) + rope + (c.get("v_head_dim") or 0)) // 2 or head_dim
        varlen = sc.runtime.serving is not None and sc.runtime.serving.attention == "varlen"
        if rank and varlen:
            # vLLM's MLA backends cache one latent of rank + rope per token and layer, on every TP rank, and decode
            # over it with absorbed projections (DeepSeek-V2, arXiv:2405.04434 2.1.3)
            kv_heads, prefill_kv_heads, kv_elements = 1, q_heads, float(rank + rope)
            flops_per_key = 2.0 * q_heads * (2 * rank + rope)     # scores over rank + rope, values over rank
        else:
            kv_elements = 2.0 * kv_heads * head_dim
            flops_per_key = 4.0 * q_heads * head_dim
        element = DTYPE_BYTES[sc.dtype]
        kv_bytes = DTYPE_BYTES.get(sc.kv_dtype, element)          # "auto": the model dtype
        return cls(layers=layers // sc.plan.pp, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                   element_bytes=element, kv_elements=kv_elements, kv_element_bytes=kv_bytes,
                   decode_flops_per_key=flops_per_key, prefill_kv_heads=prefill_kv_heads)

    @property
    def kv_bytes_per_token(self) -> float:
        """The cache of one token, all layers of one GPU."""
        return self.layers * self.kv_elements * self.kv_element_bytes


def windowed(shape: BatchShape, window: int) -> BatchShape:
    """The batch as a sliding-window layer attends over it: a decoding sequence reads at most ``window`` keys and a
    prefill query at most ``window`` keys plus its chunk's. Known inaccuracy: the step carries context sums, so the
    clip is of the sums (exact when every context is on the same side of the window)."""
    decode_ctx, prefill_ctx = windowed_contexts(shape, window)
    return BatchShape(shape.prefill_tokens, min(shape.prefill_attn_pairs, float(shape.prefill_tokens) * window),
                      shape.prefill_seqs, shape.decode_seqs, decode_ctx, prefill_ctx)


def windowed_contexts(shape: BatchShape, window: int) -> tuple[float, float]:
    """(decode, prefill) context sums a sliding-window layer attends over (windowed)."""
    return (min(shape.decode_ctx_tokens, float(shape.decode_seqs) * window),
            min(shape.prefill_ctx_tokens, float(shape.prefill_seqs) * window + shape.prefill_tokens))


def split_kv_block_n(head_dim: int) -> int:
    """Keys per key block of FA3's paged (non-TMA) forward tile (hopper/tile_size.h 27-40, 2-byte elements)."""
    return 128 if head_dim <= 128 else (96 if head_dim <= 192 else 80)


def decode_work_tiles(seqs: int, mean_ctx_tokens: float, kv_heads: int, head_dim: int, sm_count: int) -> int:
    """Work tiles (thread blocks) of FA3's split-KV decode over ``seqs`` sequences of ``mean_ctx_tokens`` keys:
    seqs x kv_heads x splits, splits from the dynamic scheduler (see SPLIT_KV_MAX_SPLITS). Known inaccuracy: every
    sequence is given the mean context (the scheduler splits each by its own length)."""
    if seqs <= 0:
        return 0
    n_blocks = max(math.ceil(mean_ctx_tokens / split_kv_block_n(head_dim)), 1)
    blocks_per_sm = max(math.ceil(seqs * n_blocks * SPLIT_KV_MARGIN * kv_heads / sm_count), 1)
    splits = max(min(math.ceil(n_blocks / blocks_per_sm), SPLIT_KV_MAX_SPLITS), 1)
    return seqs * kv_heads * splits


class StepCostTimer:
    """StepTimer over the scenario's step costs (see the module docstring)."""

    def __init__(self, sc: Scenario, max_tokens: int):
        self.sc = sc
        self.serving = sc.runtime.serving
        self.dims = ModelDims.of(sc)
        grid = sorted({2 ** i for i in range(int(math.log2(max(max_tokens, 1))) + 1)} | {max(max_tokens, 1)})
        rows = [self._dense(n) for n in grid]
        self.grid = np.array(grid, dtype=float)
        self.dense_gpu_s, self.dense_cpu_s, self.power_w = (np.array(col) for col in zip(*rows))
        self._memo: dict = {}
        windows = sliding_windows(sc.config)
        # (share of layers windowed, window): their attention reads at most the window's keys
        self._window = (windowed_fraction(sc.config), windows["window"]) if windows else None
        self._decode_scale, self._graph_credit_s, self._replay_s, self._replay_gap_s = self._kernel_adjustments()

    def _kernel_adjustments(self) -> tuple[float, float, float, float]:
        """What aisim.step's device half applies to every kernel of this runtime (step._device_half): the
        engine's compute-efficiency scale, the CUDA-graph replay credit, the replayed kernel's floor and its
        replay gap."""
        from ...cost.efficiency import runtime_scales
        from ...step import graph_credit_s, replay_kernel_gap_s

        cal = self.sc.calibration
        compute_scale, _ = runtime_scales(self.sc.runtime, self.sc.device.gpu, cal, self.sc.dtype)
        return compute_scale, graph_credit_s(self.sc, cal), cal.launch_overhead_s, replay_kernel_gap_s(self.sc)

    def _dense(self, n: int) -> tuple[float, float, float]:
        cost = step_cost(self.sc, StepShape(phase="prefill", batch=1, seq=n))
        attention_s = sum(r.time_ms for r in cost.table if r.name.startswith("attention")) / 1e3
        power = cost.energy_j / cost.runtime_s if cost.runtime_s else 0.0
        return max(cost.gpu_busy_s - attention_s, 0.0), cost.cpu_busy_s, power

    # ---- the attention graph cache (runtime serving.attention_graph_build_s)
    @property
    def graph_build_s(self) -> float:
        """Host time of one attention graph build, 0 where the engine has no per-shape build."""
        return self.serving.attention_graph_build_s if self.serving is not None else 0.0

    @property
    def idle_power_w(self) -> float:
        """The replica's tp x pp GPUs' power while they wait for work or for the host (an attention graph build):
        the calibration's waiting power of a loaded process, per GPU (cost.energy.waiting_power_w)."""
        from ...cost.energy import waiting_power_w

        return waiting_power_w(self.sc.device.gpu, self.sc.calibration) * self.sc.plan.tp * self.sc.plan.pp

    def attention_shapes(self, shape: BatchShape) -> tuple[tuple[int, int], ...]:
        """The (query tokens, key tokens) of the step's attention calls, one per distinct layer kind: the packed
        batch's keys are every sequence's context (the new tokens included); a sliding-window layer's, at most its
        window per sequence (windowed)."""
        q = shape.tokens
        full = (q, round(shape.decode_ctx_tokens + shape.prefill_ctx_tokens))
        if not self._window:
            return (full,)
        share, window = self._window
        clipped = (q, round(sum(windowed_contexts(shape, window))))
        return (clipped,) if share >= 1.0 or clipped == full else (full, clipped)

    # ---- the StepTimer protocol
    def step_time_s(self, shape: BatchShape) -> float:
        return self._cost(shape)[0]

    def step_energy_j(self, shape: BatchShape) -> float:
        return self._cost(shape)[1]

    def _cost(self, shape: BatchShape) -> tuple[float, float]:
        key = (shape.prefill_tokens, shape.decode_seqs, shape.prefill_seqs,
               round(shape.decode_ctx_tokens / KEY_ROUND), round(shape.prefill_ctx_tokens / KEY_ROUND),
               round(shape.prefill_attn_pairs / KEY_ROUND ** 2))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._compute(shape)
        return found

    def _compute(self, shape: BatchShape) -> tuple[float, float]:
        pp = self.sc.plan.pp
        # an engine with a batch per stage in flight (ServingSpec.pipeline_batches) runs the step as m micro-batches
        # of a 1/m share each, one behind the other through the stages: a round lasts pp x one share's stage time
        m = min(pp, max(shape.seqs, 1)) if pp > 1 and self.serving is not None and self.serving.pipeline_batches \
            else 1
        part = shape if m == 1 else share(shape, m)
        n = max(part.tokens, 1)
        gpu_s = float(np.interp(n, self.grid, self.dense_gpu_s)) + self._attention_s(part)
        cpu_s = float(np.interp(n, self.grid, self.dense_cpu_s)) + self._engine_cpu_s()
        power_w = float(np.interp(n, self.grid, self.power_w))
        host_s = m * self._host_s(part)
        # gpu_s / cpu_s are one stage's, as step_cost's busy times; power_w is the whole sequential step's, each
        # stage busy once and waiting pp - 1 stage times. A round of m micro-batches keeps each stage busy m stage
        # times: the energy of m such steps less the waits the m - 1 extra ones would hold, pp stage times each
        # at the replica's waiting power (the stages' busy energy counted m times, their waits pp - m times)
        stage_s = max(gpu_s, cpu_s)
        time_s = pp * stage_s + host_s
        return time_s, power_w * time_s + (m - 1) * pp * stage_s * (power_w - self.idle_power_w)

    def _host_s(self, shape: BatchShape) -> float:
        s = self.serving
        if s is None:
            return 0.0
        kv = shape.decode_ctx_tokens + shape.prefill_ctx_tokens
        return (s.scheduler_overhead_s + s.scheduler_overhead_per_seq_s * shape.seqs + s.prepare_s
                + s.prepare_per_seq_s * shape.seqs + s.prepare_per_kv_token_s * kv)

    def _engine_cpu_s(self) -> float:
        s, cal = self.serving, self.sc.calibration
        if s is None or not (s.extra_layer_ops or s.extra_layer_views):
            return 0.0
        py = cal.eager_python_call_s or 0.0
        kernel = (cal.eager_kernel_dispatch_s or cal.eager_dispatch_s) + py
        view = (cal.eager_view_dispatch_s or cal.eager_dispatch_s) + py
        scale = host_scale(cal, "forward", self.sc.config.get("model_type"))
        return self.dims.layers * (s.extra_layer_ops * kernel + s.extra_layer_views * view) * scale

    # ---- attention
    def _attention_s(self, shape: BatchShape) -> float:
        attend = self._packed_s if self.serving is not None and self.serving.attention == "packed-mask" \
            else self._varlen_s
        if not self._window:
            return attend(shape)
        share, window = self._window
        return (1 - share) * attend(shape) + share * attend(windowed(shape, window))

    def _memory_s(self, nbytes: float, strided: bool = False) -> float:
        """One memory-bound kernel moving nbytes (read + written): the calibration's copy curve, or its
        strided-operand curve for a copy whose source is not contiguous (``strided``)."""
        from ...cost.efficiency import memory_efficiency

        if nbytes <= 0:
            return 0.0
        gpu = self.sc.device.gpu
        return nbytes / (gpu.memory_bw_bytes_per_s * memory_efficiency(self.sc.calibration, nbytes, gpu, strided))

    def _view_copy_s(self, nbytes: float) -> float:
        """A copy out of a view with contiguous innermost rows (nbytes read + written): the calibration's measured
        ``view_copy_efficiency`` of datasheet bandwidth, else the strided-operand curve."""
        eff = self.sc.calibration.view_copy_efficiency
        if eff is None or nbytes <= 0:
            return self._memory_s(nbytes, strided=True)
        return nbytes / (self.sc.device.gpu.memory_bw_bytes_per_s * eff)

    def _attention_kernel_s(self, flops: float, nbytes: float, blocks: float) -> float:
        """One attention kernel: roofline over the calibrated attention efficiency, on the SMs its grid fills."""
        from ...cost.efficiency import attention_efficiency

        if flops <= 0:
            return 0.0
        gpu, cal = self.sc.device.gpu, self.sc.calibration
        roofline = max(flops / gpu.peak_for(self.sc.dtype), nbytes / gpu.memory_bw_bytes_per_s)
        occupancy = min(1.0, blocks / gpu.sm_count)
        return roofline / (attention_efficiency(cal, self.sc.dtype, "", flops, nbytes) * occupancy)

    def _varlen_s(self, shape: BatchShape) -> float:
        d = self.dims
        layer_s = 0.0
        if shape.prefill_tokens:
            flops = 4.0 * d.q_heads * d.head_dim * shape.prefill_attn_pairs
            nbytes = d.element_bytes * d.head_dim * (2 * d.q_heads * shape.prefill_tokens
                                                     + 2 * d.prefill_kv_heads * shape.prefill_ctx_tokens)
            blocks = max(shape.prefill_tokens / SDPA_QUERY_BLOCK, 1) * d.q_heads
            layer_s += self._attention_kernel_s(flops, nbytes, blocks)
        if shape.decode_seqs:
            layer_s += self._split_kv_decode_s(shape)
        return d.layers * layer_s

    def _split_kv_decode_s(self, shape: BatchShape) -> float:
        """One layer's split-KV decode kernel, the longer of two bounds: the calibration's decode curve for its
        bytes, with the engine's scale and CUDA-graph credit (what ``estimate`` charges a q_len-1 attention,
        cost.ops_time.op_time), and its bytes at the best decode efficiency of the SMs its work tiles fill
        (active of S: each SM streams its own tiles' keys),
            time = max(op_time(B), B / (BW x eff_best x scale x active / S)).
        Known inaccuracy: one SM may draw more than 1/S of the best bandwidth, so a few tiles can run faster."""
        from ...cost.efficiency import attention_efficiency

        d, gpu, cal = self.dims, self.sc.device.gpu, self.sc.calibration
        flops = d.decode_flops_per_key * shape.decode_ctx_tokens
        nbytes = d.kv_elements * d.kv_element_bytes * shape.decode_ctx_tokens
        roofline = max(flops / gpu.peak_for(self.sc.dtype), nbytes / gpu.memory_bw_bytes_per_s)
        eff = attention_efficiency(cal, self.sc.dtype, "decode", flops, nbytes, gpu) * self._decode_scale
        full_gpu_s = (max(roofline / eff - self._graph_credit_s, roofline, self._replay_s) if self._graph_credit_s
                      else roofline / eff) + self._replay_gap_s
        tiles = decode_work_tiles(shape.decode_seqs, shape.decode_ctx_tokens / shape.decode_seqs, d.kv_heads,
                                  d.head_dim, gpu.sm_count)
        active = min(tiles, gpu.sm_count) / gpu.sm_count
        best = attention_efficiency(cal, self.sc.dtype, "decode", 0.0, BEST_DECODE_BYTES, gpu) * self._decode_scale
        return max(full_gpu_s, nbytes / (gpu.memory_bw_bytes_per_s * best * active))

    def _packed_s(self, shape: BatchShape) -> float:
        """paged|sdpa per layer, kernel by kernel (the step's Q queries, K keys; bytes read + written):
        generation/continuous_batching/cache.py PagedAttentionCache.update 425-435: index_copy_ of the new K and V
        rows, then (when the step reads the cache) index_select of every key and value the step attends to (a row
        gather: the copy curve); integrations/sdpa_paged.py 6-15 and 44-50: repeat_kv expands the [1, Hkv, K, D]
        transposed view of what it read to the query heads and reshapes it (with as many KV heads as query heads
        it returns the view, which key.contiguous() and value.contiguous(), lines 56-58, copy instead, at the
        calibration's view_copy_efficiency: OLMoE's H100 profile, validation/data/profiles/
        cbmoe-olmoe-1b-7b-profile.txt, has 32 such copies per 32 x 1024 decode step, about 0.18 ms each), a copy
        from a non-contiguous source,
        which PyTorch runs with its generic (non-vectorized) elementwise copy kernel: the calibration's
        strided-operand curve (H100 profile of the engine's step, validation/data/profiles/cb-*-profile.txt,
        64 x 1024 decode: 0.33 and 0.25 ms per copy of 671 and 235 MB, 30% and 28% of HBM bandwidth, against 26%
        on that curve); query.contiguous() and the output's transpose(1, 2).contiguous() (sdpa_paged.py 56, 69),
        the same kernel; the masked SDPA (cuDNN's on H100: the calibration's table); and once per step the
        [1, 1, Q, K] mask (input_outputs.py 418)."""
        d, e = self.dims, self.dims.element_bytes
        q = shape.tokens
        cached = shape.decode_ctx_tokens + shape.prefill_ctx_tokens - shape.prefill_tokens - shape.decode_seqs
        k = float(q) if cached <= 0 else shape.decode_ctx_tokens + shape.prefill_ctx_tokens
        kv_row = d.kv_heads * d.head_dim * e
        q_row = d.q_heads * d.head_dim * e
        layer = 2 * self._memory_s(2 * q * kv_row)                   # index_copy_ of the new K and V
        if cached > 0:
            layer += 2 * self._memory_s(2 * k * kv_row)              # index_select of every key and value read
        # K and V reach SDPA as a transposed view of what was read: repeat_kv's reshape copies it to the query heads
        # (GQA: an expanded view, the strided-operand curve), or, where the model has as many KV heads as query
        # heads, repeat_kv returns the view and key.contiguous() / value.contiguous() copy it (sdpa_paged.py 12-13
        # and 56-58), a copy whose head_dim rows stay contiguous (view_copy_efficiency where the calibration has it)
        if d.q_heads != d.kv_heads:
            layer += 2 * self._memory_s(k * kv_row + k * q_row, strided=True)
        else:
            layer += 2 * self._view_copy_s(2 * k * kv_row)
        layer += 2 * self._memory_s(2 * q * q_row, strided=True)     # query and output .contiguous()
        flops = 4.0 * q * k * d.q_heads * d.head_dim
        sdpa_bytes = e * (2 * q * d.q_heads * d.head_dim + 2 * k * d.q_heads * d.head_dim + q * k)
        mask_s = self._memory_s(q * k * e)                           # the step's [1, 1, Q, K] mask, built once
        return d.layers * (self._masked_sdpa_s(q, k, flops, sdpa_bytes) + layer) + mask_s

    def _masked_sdpa_s(self, q: int, k: float, flops: float, nbytes: float) -> float:
        """SDPA with an explicit mask: the calibration's measured Q x K table, rescaled to this model's heads by SM
        occupancy and capped at its row's best (aisim.cost.efficiency.masked_attention_efficiency, as estimate's
        static-cache decode reads it), else the attention curve on the SMs the grid fills."""
        gpu = self.sc.device.gpu
        eff = masked_attention_efficiency(self.sc.calibration, gpu, q, k, self.dims.q_heads)
        if eff is None:
            return self._attention_kernel_s(flops, nbytes, math.ceil(q / SDPA_QUERY_BLOCK) * self.dims.q_heads)
        roofline = max(flops / gpu.peak_for(self.sc.dtype), nbytes / gpu.memory_bw_bytes_per_s)
        return roofline / eff
