"""What to run: the workload (phase, batch, seq, dtype) and the parallel plan, as validated pydantic data."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Phase = Literal["forward", "prefill", "decode", "generate", "encode", "forward-backward", "train", "transcribe"]
StepPhase = Literal["forward", "prefill", "decode", "encode", "forward-backward", "train"]
TpScope = Literal["all", "full", "layers", "mlp", "attention"]
DType = Literal["fp32", "tf32", "fp16", "bf16"]
Quant = Literal["none", "bitsandbytes-int8", "int8", "fp8", "int4"]
# PyTorch Lightning's precision vocabulary (lightning.fabric.connector._PRECISION_INPUT)
Precision = Literal["bf16-mixed", "16-mixed", "bf16-true", "16-true", "32-true"]
Recompute = Literal["none", "selective", "full"]
MAX_TOKENS = 10_000_000      # bounds on what a step can physically hold: beyond any model's context x batch
MAX_BATCH = 1_000_000
MAX_AUDIO_S = 366 * 24 * 3600  # a year of audio


class Workload(BaseModel):
    """One workload. ``seq`` is the input length (forward/prefill/encode/train) or the context length (decode)."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    phase: Phase = "forward"
    batch: int = Field(1, ge=1, le=MAX_BATCH)
    seq: int = Field(1024, ge=1, le=MAX_TOKENS)
    gen_tokens: int = Field(128, ge=1, le=MAX_TOKENS, description="new tokens of a generate workload (gen - 1 "
                            "decode steps)")
    dtype: DType = "fp16"
    with_loss: bool = Field(False, description="forward includes the LM loss over the full logits (labels given)")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    quant: Quant = "none"
    step_tokens: int = Field(1, ge=1, le=MAX_TOKENS, description="decode: new tokens each sequence feeds in the step (whisper.cpp "
                             "prompt calls feed many); the cache holds seq - step_tokens tokens before it")
    logits_all: bool = Field(False, description="decode: logits for every new token (beams stepping as tokens of "
                             "one sequence) instead of the last one")
    static_cache_len: int | None = Field(None, ge=1, le=MAX_TOKENS, description="decode under a static-cache "
                                         "runtime (--runtime graphs): the StaticCache's max_cache_len, the keys every "
                                         "step attends over (masked); None: the context (seq)")
    attn_impl: Literal["auto", "eager", "sdpa"] = Field(
        "auto", description="attention as traced: sdpa where the model supports it (auto), or explicit matmul + "
                            "softmax (eager, as ggml without flash attention runs it)")
    encode_cross_kv: bool = Field(False, description="encode also projects the decoder's cross-attention K/V from "
                                  "the encoder output (whisper.cpp and CTranslate2 do it there; HF in decode)")
    audio_s: float | None = Field(None, gt=0, le=MAX_AUDIO_S, description="transcribe: seconds of audio")
    beam: int = Field(5, ge=1, le=64, description="transcribe: beam size (beams step together as one batched call)")
    transcript_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="transcribe: output tokens "
                                          "(default from the assumed speech rate)")
    windows: int | None = Field(None, ge=1, le=MAX_AUDIO_S // 30 + 1, description="transcribe: 30 s windows "
                                "encoded (default ceil(audio/30))")
    autocast: bool = Field(False, description="train: weights in fp32, matmuls under an autocast to ``dtype`` "
                           "(torch.autocast's op lists, emulated on the meta device: aisim.graph.autocast)")
    recompute: Recompute = Field("none", description="train: activation checkpointing of every decoder layer "
                                 "(full: HF gradient_checkpointing, non-reentrant)")
    grad_release: bool = Field(False, description="train: each parameter's full gradient is freed once produced "
                               "(reduce-scattered by ZeRO-2/3 / FSDP); the sharded gradient is the memory model's")


class TrainPlan(BaseModel):
    """How a training step runs beyond the traced graph: precision mode, sharding of states, micro-batching.

    ``zero``: 0 plain DDP, 1 optimizer states sharded, 2 + gradients, 3 + parameters (FSDP FULL_SHARD);
    ``fsdp``: FSDP2 ``fully_shard`` per decoder layer (full = FULL_SHARD, grad-op = SHARD_GRAD_OP, hybrid =
    HYBRID_SHARD: sharded inside a node, replicated across nodes), which sets ``zero`` to 3 (full, hybrid) or 2.
    ``micro_batch``: sequences per micro-batch per data-parallel replica (default: the replica's whole batch
    over ``grad_accum``)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    precision: Precision = "bf16-mixed"
    zero: Literal[0, 1, 2, 3] = 0
    fsdp: Literal["none", "full", "grad-op", "hybrid"] = "none"
    recompute: Recompute = "none"
    micro_batch: int | None = Field(None, ge=1, le=MAX_BATCH)
    grad_accum: int | None = Field(None, ge=1, le=MAX_BATCH)
    pp_schedule: Literal["1f1b", "interleaved"] = "1f1b"
    virtual_stages: int = Field(2, ge=1, le=1024, description="interleaved 1F1B: model chunks per pipeline stage")
    bucket_mb: float = Field(25.0, gt=0, le=1e6, description="DDP gradient bucket (bucket_cap_mb, default 25)")
    optimizer_impl: Literal["fused", "foreach"] = "fused"
    attention: Literal["fused", "explicit"] = Field("fused", description="fused: one flash/SDPA kernel; explicit: "
                                                    "QK^T, softmax and PV as separate kernels (frameworks before "
                                                    "FlashAttention, e.g. Megatron-LM 2021)")

    @model_validator(mode="after")
    def _one_sharding(self) -> "TrainPlan":
        implied = {"none": self.zero, "full": 3, "hybrid": 3, "grad-op": 2}[self.fsdp]
        if self.zero not in (0, implied):
            raise ValueError(f"zero {self.zero} contradicts fsdp {self.fsdp} (ZeRO stage {implied}); give one of them")
        return self

    @property
    def stage(self) -> int:
        """The ZeRO stage in effect (FSDP's sharding strategy mapped onto it)."""
        return {"none": self.zero, "full": 3, "hybrid": 3, "grad-op": 2}[self.fsdp]


class StepShape(BaseModel):
    """What one step computes, apart from the scenario: the phase, batch and sequence (the input length, or the
    context of a decode step), the new tokens per sequence of a decode call, and whether every new token gets
    logits (None: as the runtime does)."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    phase: StepPhase = "forward"
    batch: int = Field(1, ge=1, le=MAX_BATCH)
    seq: int = Field(1024, ge=1, le=MAX_TOKENS)
    step_tokens: int = Field(1, ge=1, le=MAX_TOKENS)
    logits_all: bool | None = None
    static_cache_len: int | None = Field(None, ge=1, le=MAX_TOKENS)


class ParallelPlan(BaseModel):
    """Tensor (Megatron column/row), pipeline and data parallel degrees. ``tp_scope='mlp'`` shards only the MLP."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    tp: int = Field(1, ge=1, le=100_000)
    pp: int = Field(1, ge=1, le=100_000)
    dp: int = Field(1, ge=1, le=100_000)
    tp_scope: TpScope = "all"
    ep: int = Field(1, ge=1, le=100_000, description="expert parallel degree: MoE experts spread over ep of the "
                    "tp x dp GPUs of a stage (vLLM --enable-expert-parallel); 1: experts tensor-parallel")
    moe_reduce_once: bool = Field(False, description="MoE with a shared expert under tp: the shared and routed "
                                  "experts' partial outputs summed, then one all-reduce (vLLM's FusedMoE and "
                                  "shared-expert MLP with reduce_results=False); False: each row-parallel output "
                                  "all-reduced, as HF's modules run them")
    kv_replicas: int = Field(1, ge=1, le=100_000, description="copies of each KV head over the tp GPUs (vLLM's "
                             "num_kv_head_replicas, tp / num_key_value_heads where tp exceeds it); 1: KV heads "
                             "sharded")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp
