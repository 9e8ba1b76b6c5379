"""docs/accuracy.md, generated from the committed measured datasets and the published reference tables.

    python -m aisim.validation.accuracy [--out docs/accuracy.md]      (or: aisim validate --accuracy-doc PATH)

Every figure in the document comes from this command: it estimates each measured case with the shipped specs and
calibration files and prints the error tables; the goals of the validation issue are checked per category.
"""
from __future__ import annotations

from datetime import date
from pathlib import Path

import typer

from .cli import new_app, run

from .published import compare_reference
from .report import compare, load_measurements, render_markdown, summarize, summary_table
from .runner import read_jsonl

DATA_DIR = Path(__file__).parent / "data"
DATASETS = (("h100.jsonl", "one H100 SXM 80GB"), ("h200.jsonl", "one H200"),
            ("tp2-h200.jsonl", "two H200 (tensor parallel 2, with TP=1 twins)"),
            ("tp4-h200.jsonl", "four H200 (tensor parallel 4, with TP=1 twins; Llama-2-70B at TP 4)"),
            ("whisper-h200.jsonl", "one H200, Whisper encoder-decoder (encode, decoder steps, prompt calls)"),
            ("tp2-moe-h100.jsonl", "two H100 SXM 80GB, MoE at tensor parallel 2 (every expert split; Mixtral-8x7B "
             "with 16 of its layers and Qwen1.5-MoE-A2.7B, with TP=1 twins)"),
            ("tp2-moe-h100-run2.jsonl", "the same MoE suite again, right after, on the same two H100s"),
            ("tp2-mixtral-h200.jsonl", "two H200, the whole Mixtral-8x7B at tensor parallel 2 (48 GB per GPU, what "
             "two 80 GB H100s would hold) with its TP=1 twin"),
            ("tp2-moe-ep-h100.jsonl", "two H100 SXM 80GB, the same MoE models with their experts split by index "
             "(tp 2, ep 2)"),
            ("tp2-moe-ep-h100-run2.jsonl", "the expert-parallel suite again, on another two-H100 machine (a slow "
             "host)"),
            ("tp2-moe-h100-run3.jsonl", "the width-split suite's TP=2 cases on that machine, minutes after"))
GPU_BOUND_TOKENS = 2048
# Goals (validation issue): category -> maximum MAPE in percent
GOALS = {"forward/prefill runtime": 5.0, "decode runtime": 10.0, "forward-backward/train runtime": 10.0,
         "peak memory": 3.0, "energy per token": 10.0, "tp runtime": 10.0}
# Regression ceilings: dataset -> category -> the MAPE (%) it must stay under. Each is the value of the commit that
# set it plus half a point (never above what the docs claim); a change that worsens accuracy fails
# tests/test_accuracy_ceilings.py. Lower a ceiling when accuracy improves; raise one only with the reason in the
# commit message.
CEILING_MARGIN_PCT = 0.5
CEILINGS = {
    "h100.jsonl": {"forward/prefill runtime": 6.9, "decode runtime": 10.3, "forward-backward/train runtime": 13.4,
                   "peak memory": 1.1, "energy per token": 18.3},
    "h200.jsonl": {"forward/prefill runtime": 8.6, "decode runtime": 8.4, "forward-backward/train runtime": 9.1,
                   "peak memory": 1.3, "energy per token": 13.2},
    "tp2-h200.jsonl": {"forward/prefill runtime": 11.9, "decode runtime": 11.2, "tp runtime": 10.7,
                       "peak memory": 0.8, "energy per token": 23.8},
    "tp4-h200.jsonl": {"forward/prefill runtime": 7.3, "decode runtime": 10.0, "tp runtime": 15.1,
                       "peak memory": 0.7, "energy per token": 28.1},
    "whisper-h200.jsonl": {"encode runtime": 7.6, "decode runtime": 9.6, "peak memory": 1.7,
                           "energy per token": 25.95},
    "tp2-moe-h100.jsonl": {"forward/prefill runtime": 5.6, "decode runtime": 7.2, "tp runtime": 13.7,
                           "peak memory": 0.6, "energy per token": 27.2},
    "tp2-moe-h100-run2.jsonl": {"forward/prefill runtime": 3.9, "decode runtime": 5.5, "tp runtime": 8.0,
                                "peak memory": 0.6, "energy per token": 25.7},
    "tp2-mixtral-h200.jsonl": {"forward/prefill runtime": 5.8, "decode runtime": 24.1, "tp runtime": 28.0,
                               "peak memory": 0.5, "energy per token": 31.6},
    "tp2-moe-ep-h100.jsonl": {"tp runtime": 30.4, "peak memory": 0.7, "energy per token": 43.1},
    "tp2-moe-ep-h100-run2.jsonl": {"tp runtime": 41.4, "peak memory": 0.7, "energy per token": 51.2},
    "tp2-moe-h100-run3.jsonl": {"tp runtime": 39.1, "peak memory": 0.7, "energy per token": 48.8},
}

WHY = """\
## Where the goals are missed, and why

- **GPU-bound steps are close; launch-bound steps carry the host.** Every fp16/bf16 forward and prefill step of
  4 x 512 tokens or more is within 10% (most within 5%), fp32 training steps within 6%, and peak memory within
  1.5% MAPE. bf16 training of the small models is launch-bound (its GPU work is short) and falls with them.
  Small steps (batch 1 x 128 forwards, decode at small batch, bf16 training of small models) are CPU-bound in
  eager PyTorch: their time is the host's Python and dispatch cost. aisim charges it per aten op from
  microbenchmarks (a plain add on the calibration host times each op's measured ratio to it: a GEMM about 1.8, a
  view 0.1-0.3; validation/harness/op_host.py), per nn.Module call and collective, scaled by the measured overhead
  of tiny HF models that no table uses (`eager_framework_scale`), and in training steps by how much more autograd
  costs the host per op than a forward (`eager_phase_scale` train 1.39, the same tiny models timed forward and
  forward-backward in one loop: validation/data/kernels/framework-phases-h100.jsonl). The host varies more than that model can
  know: the same microbenchmark gave a framework scale of 0.95 to 2.30 on H100 machines of the same kind, and the
  five runs of this suite on the H100 machines the device lent (`h100.jsonl`, `h100-rerun.jsonl`,
  `h100-rerun2.jsonl`, `h100-rerun3.jsonl`, `h100-rerun4.jsonl`; the transfer section below) differ from each other
  by 10-21% MAPE per category: cs336-small bf16 forward-backward took 53.6, 35.8, 34.1, 28.0 and 52.7 ms, Llama-3-8B
  forward batch 1 x 128 19.9, 30.0, 38.4, 18.4 and 53.5 ms. Estimating each run with
  its own host lines (validation/host.py, `--host`) did not help: decode MAPE of the second run went 13.7% ->
  18.7%; the tiny models' framework scale does not track real models' host cost closely enough.
- **Decode steps that get faster as the batch grows** (Llama-3-8B at batch 8 x 4096: 14.5-17.4 ms in every H100
  run, below the 19-20 ms of batch 1) are a property of the harness: validation/measure.py rewinds the cache between
  trials (crop, then every layer's K and V made contiguous) without synchronizing, so the host issues the next step
  while the GPU still copies and the step's start event sits behind the copies. A host-bound row is timed short by
  that head start, up to the copies' GPU time (the crop + contiguous copy's speed measured by
  validation/harness/eager_attention.py on H100). aisim's decode estimates in these tables are as the harness times them
  (validation/rewind.py: max(GPU busy, runtime - head start)); a generation loop, which synchronizes on every next
  token, sees the plain estimate. Apart from it, a launch costs the host 5-12% less while the GPU is busy
  (validation/harness/launch_busy.py, validation/data/kernels/launch-busy-h100-run*.jsonl: tiny add / mm / a
  decoder layer, idle vs behind a 20 ms kernel): not modelled.
- **Energy of GPU-bound fp16/bf16 steps follows the power limit.** Large steps run at the 700 W limit throughout
  (measured 690-700 W). aisim priced each kernel at the power of a loop of that kernel, and the norms, elementwise
  ops and copies between the GEMMs drew 386-450 W by the memory curve: those steps came out 10-25% low. A
  microbenchmark (validation/harness/power_mix.py, four H100 machines) shows why: a GEMM loop is held at the limit
  by its clocks (1260-1335 MHz), but GEMMs between adds, or alone between waits, run unthrottled and draw more; an
  interleaved mix sits near the limit (681-700 W where GEMMs take >= 43% of the time, against 569-656 W from the loop
  powers), and a 4096^3 GEMM every 0.4 ms averages 473 W where its loop power and the waiting power give 408 W.
  Memory-bound kernels between waits draw their loop power (within 2%). The rule fitted to those runs
  (`power_limit_mix`: tensor-core compute-bound kernels 1.46x their loop's power above the waiting power, 1.42x
  since the power overlap below, the step's average held to 0.9875 of board power; python -m
  aisim.validation.scripts.derive_power_mix, power MAPE over 26 sequences and gapped runs 6.5% -> 2.6% (6.0% ->
  2.6% with the overlap); on a fifth H100 machine run after the fit, held out, 5.7% -> 2.1%:
  `--check validation/data/kernels/power-mix-h100-check.jsonl`), with the memory curve's top from the same loops
  (a large add at 0.90 of bandwidth: 515 W), takes energy per token on h100.jsonl from 17.16% to 11.14% MAPE and on
  h200.jsonl from 12.63% to 8.22% (the H200 carries the H100's constants: the same die and limit, its own loop
  powers; its own run of the harness, made after they were committed, is predicted at 2.7% against 5.9% at the
  loop powers: `--calibration h200 --check validation/data/kernels/power-mix-h200.jsonl`), tp2-h200.jsonl 23.23% ->
  19.98%, tp4-h200.jsonl 27.53% -> 22.96%, whisper-h200.jsonl 23.82% -> 19.17%, the serving runs' J/token 29.2% ->
  26.2%. The GPU-bound 16-bit forward and prefill rows are now within -7..+6% but bloom-560m forward 16 x 1024
  (-19% H100, -13% H200). The host-bound steps (batch 1 x 128 forwards) stayed 20-46% low: their GEMMs of 128
  rows keep the tensor cores and HBM busy at once, and such a kernel draws more than either activity alone
  (opt-13b's forward drew 652 W on an H100). Weight-streaming GEMM loops of 1-4096 rows on an H200
  (validation/harness/power_mix.py --skinny) reach the 700 W limit from 64 rows while the machine's copy loop draws
  547 W; the calibration's `power_overlap` (on tensor-core kernels, the smaller activity's power added to the
  larger's: 1.0, fitted with each run's memory power normalised to its own copy loop; python -m
  aisim.validation.scripts.derive_power_overlap: power MAPE over those loops 8.1% -> 1.7%, on a second H200 at other
  shapes and fp16, held out, 9.4% -> 2.8%; transferred to the H100 SXM) takes energy per token on h100.jsonl to
  7.15% and h200.jsonl to 5.04%, tp2 15.59%, tp4 19.61%, whisper 15.84%, the serving runs' J/token 21.6%; on model
  steps measured after it was committed, of models no energy table holds (validation/suites/energy-heldout.yaml on
  an H200; python -m aisim.validation.scripts.check_energy), 7.4% -> 3.7%. What stays
  low: the host-bound bf16 training rows, whose times are short, opt-1.3b prefill and bloom-560m 1 x 128 (whose
  runtimes are 42-55% off too), and the MoE and tensor-parallel rows' host-bound steps.
  Decode rows whose energy window was dominated by the untimed cache
  copies between trials are reported n/a (the subtraction implied more than the card's 700 W).
- **Tensor-parallel launch-bound rows**: the measured implementation (plain sharded weights, an NCCL all-reduce
  from a forward hook, a barrier before each trial) makes TP=2 slower than TP=1 at batch 1 (Llama-3-8B decode:
  30.9 ms against 19.0 ms). A tight loop of all-reduces costs the host 24-47 us each; inside the model each one
  costs far more. Tiny non-judged models at 1, 4 and 16 layers measure it (validation/suites/tp-tiny.yaml and
  tp-tiny4.yaml on a 2-GPU and a 4-GPU H100 host and a 2-GPU H200 host: validation/data/kernels/tp-tiny-*.jsonl):
  a TP=2 step adds 115-240 us per all-reduce over its TP=1 twin on one host, 320-370 us on another (one sweep there,
  whose TP=1 16-layer point is an outlier, gives -90 us and stays in the median), and 100-110 (opt) or 495-540 us
  (llama) on the third; TP=4 adds 310-570 us, 1.1-1.6x TP=2's on the same host. aisim charges each eager
  all-reduce `eager_collective_host_adds` (TP 2: 10.5 plain adds, the median over the three hosts' sweeps; TP 4:
  14.6, that times the same-host ratio; python -m
  aisim.validation.scripts.derive_collective_host), which took the tp runtime MAPE from 20.9% to 10.2% (TP 2) and
  23.7% to 14.6% (TP 4). GPU-bound TP rows are within 3% MAPE (the subset lines of the tp2 and tp4 datasets; the
  all-reduces' GPU-side alpha-beta fits and the TP 4 host's issue cost measured on these fabrics:
  hardware_specs/systems/h200x2.yaml, h200x4.yaml; Llama-2-70B forward 4 x 1024 within 3%); Llama-2-70B's
  host-bound rows stay 33-40% short (126 ms
  at decode batch 1 and 16 alike, for 9 ms of weight reads per GPU, 160 all-reduces), and the batch 1-16 decode
  rows of the smaller models range -27..+10%: the per-all-reduce cost is a host property, up to 5x apart.
- **Whisper decoder steps are host-bound on an H200** (10-15 ms for a step whose GPU work is 1-3 ms): two runs of
  the whisper suite on H200 hosts 25 minutes apart gave whisper-small decode 1 x 150 at 5.96 and 9.28 ms and
  whisper-medium.en decode 5 x 440 at 17.3 and 9.9 ms; the committed dataset is the second run (after the
  energy subtraction of the cache copies was added to the encoder-decoder driver). Encode at batch 5-8 was 22-29%
  short until the kernel profile (validation/data/profiles/h200-whisper-medium-encode.txt) showed why: Whisper's
  conv output is a transposed view, so the residual adds and layer norms of the encoder read an operand across
  its innermost dim at 0.12-0.3 of HBM bandwidth. A microbenchmark of such ops (calibrate --add-transposed) now
  feeds a separate curve, and those rows are 6-12% short.
- **The train rows' optimizer is torch.optim.AdamW with its defaults** (validation/measure.py), which on CUDA is
  the foreach implementation: 8 kernels, each a full pass over a parameter-sized list (12 reads and 8 writes per
  parameter, counted from torch/optim/adam.py _multi_tensor_adam; formulas.ADAMW_STREAMS), and a parameter-sized
  list of square roots alive at its peak. The rows are estimated with `optimizer_impl="foreach"`, as the record
  says; they were estimated as the fused kernel (one pass, 7 streams) until 2026-11-26, which left cs336-2.7b train
  11% (fp32) and 29% (bf16) short and its memory 13% and 11% low on h100.jsonl; now -4.3% / -3.2% and -0.4% /
  -0.1%. The passes run at the bandwidth AdamW's multi_tensor_apply kernels reached in a microbenchmark of other
  sizes (validation/harness/gemm_align.py, two H100 hosts: 0.77 of datasheet for fp32, 0.69 for bf16), nothing
  fitted to these rows.
- **BLOOM's eager attention runs three kernels the meta trace got wrong** (kernel profile of bloom-560m forward
  16 x 1024 on an H100, validation/data/profiles/h100-profile-2026-11-27.txt, and a microbenchmark of the same
  kernels at other shapes, validation/harness/broadcast_ops.py): its ALiBi ``baddbmm`` first copies the expanded
  bias into the output (a broadcast copy at 0.30 of bandwidth) and its GEMM reads it back; the (B, 1, S, S) mask
  added over the heads leaves the vectorized kernel (0.45 of bandwidth); and ``softmax(fp16, dtype=float32)`` is
  one kernel on CUDA (ATen SoftMax.cpp ``half_to_float``), where the trace had a cast plus a float softmax. With
  all three, bloom-560m forward 16 x 1024 goes from -9.9% to -3.7% (H100) and -13.3% to -10.2% (H200), and to
  -2.5% (H200) once the two fractions keep their absolute rate on another GPU (an H200 run of the same
  microbenchmark reaches the H100's rate, 0.21 and 0.32 of its bandwidth: efficiency.broadcast_fraction); the
  outer-broadcast rule also takes the rotary tables' (B, 1, S, D) multiplies over the heads, which adds 1-2% to
  Llama prefills (unmeasured at those shapes).
- **GPT-2's LM head is off cuBLAS's alignment**: its 50257-wide output (and, in backward, operand) has a leading
  dimension that is not a multiple of 8, so cuBLAS runs its three GEMMs on older kernels at 4-8x the aligned time
  (1.8-2.7 ms each for gpt2-large in the kernel profile, validation/data/profiles/h100-profile-2026-11-26.txt). The
  tracer flags such GEMMs and they run at the plateau the gemm_align microbenchmark measured (0.099 of the 16-bit
  peak with an odd output, 0.145 with an odd input; Hopper only, from 512 rows): the gpt2 bf16 forward-backward
  rows gained 2-5 ms of GPU time
  (gpt2-large on h100.jsonl -45.9% -> -39.5%; the rest of those rows is host time, which varies 1.5x between the
  H100 runs).
- **fp32 GEMMs between the table's grid points pay a partial last wave.** The fp32 training rows were 2-8% short
  on every H100 and H200 run (gpt2-xl -8%): the kernel profile of gpt2-xl forward-backward
  (validation/data/profiles/h100-profile-2026-11-27.txt) has its Conv1D addmms 15% slower than the table read at
  their shapes (1600 / 4800 / 6400 wide). A microbenchmark at generic shapes (validation/harness/gemm_layout.py)
  rules out the operand layout and the bias epilogue (fp32 time over the table's x @ W.t(): x @ W 0.99, dY.t() @ X
  0.96, addmm 1.00) and shows, in dense sweeps of M and N, a sawtooth the grid of powers of 4 cannot see: 0.74 of
  peak at N = 4224, 0.54 at 4352, rising back to 0.75 at 6272 (M = K = 2048), where the output's 128 x 128 tiles
  (two per SM) overflow a whole number of waves over the 132 SMs. `gemm_wave_tiles` (python -m
  aisim.validation.scripts.derive_gemm_waves; the H100 and H200 sweeps each give the same rule: 128 x 128, 2 per
  SM, from 2 full waves, sweep error 7.6% -> 3.9% on H100, 7.9% -> 3.9% on H200) scales the table by the shape's
  wave fill over the fill its grid neighbours carry. fp32 forward-backward/train on h100.jsonl 12.69% -> 11.57%
  (transferred 10.70% -> 9.77%), h200.jsonl 8.64% -> 7.60%, every other run's about 1 point lower; the fp32 rows
  are now within -3.5..+2.4% but for gpt2 (-3..-6%) and cs336-small on the fifth H100 run's slow host (-8.9%).
  16-bit sweeps have no regular sawtooth (Hopper's kernels pick tiles per shape; the best tile rule takes the bf16
  sweep only from 10.2% to 8.4%) and keep the table as measured.
"""


TGI_TEXT = """\
No goal was set for this table. Estimates use `--runtime tgi-2023` (TGI 0.x's per-request loop, prompt logprobs
over the full vocabulary at prefill and a gRPC call per step, counted in its source) and, for the int8 run,
bitsandbytes' LLM.int8 matmul expanded from its source (quantize with outlier split, two host syncs, col32
transform, int8 GEMM, dequantize, fp16 outlier matmul). The best-fit line above ranks the candidate devices; all
A100 variants use the default rules (no A100 calibration file), with TGI's Python-issued all-reduces at the
in-model cost the tiny TP sweeps measured (`eager_collective_host_adds`, an assumption for TGI's own TP layers).
The NVSwitch A100 40GB and the PCIe A100 rank close; the PCIe system gains on the 8-shard rows, whose all-reduces
then cross PCIe, but overshoots the large-batch 8-shard prefills. Remaining gaps: fp16 prefill is 35-60% short at
4-8 shards on the NVSwitch A100s (TGI's BLOOM code and 2023 host are slower than the 2026 transformers code traced
here; tokenizer and detokenizer CPU time is not modelled), and int8 steps are about 25% short (LLM.int8's Python
ran on a 2023 host; its per-call costs here are today's calibrated eager dispatch costs)."""

WHISPER_TEXT = """\
No parameter was fitted to these rows. The GTX 1650 laptop GPU has no measured calibration: its file
(hardware_specs/calibration/gtx-1650-mobile.yaml) holds the default rules plus published PyTorch measurements of
cuBLAS fp16 GEMMs on TU11x cards (their emulated tensor-op path: 0.12 of the FP32 rate for large GEMMs, 0.037 of
the roofline for 2-16 rows, the GEMV path for one row). The backend profiles (hardware_specs/runtimes/ggml-cuda.yaml,
ggml-vulkan.yaml) take their efficiencies from other measurements: llama.cpp's cuBLAS FP16 figure on a GTX 16xx for
CUDA, and a whisper.cpp bench of medium on an AMD RX 6750 GRE (issue #89) for Vulkan, transferred by fraction of
peak (validation/scripts/derive_ggml_profiles.py). The runs per phase (windows, decoder calls, tokens) are read
from each printout as the workload. What the rows show: encode is within 12% (Vulkan) and 20% (CUDA) of the
printouts; prompt calls are 23-33% fast. CUDA batchd (five beams as one 5-row call) is 4.5x slow: the only
small-M measurement on this GPU class is PyTorch's cuBLAS call (pytorch/pytorch#195716, 4.4 GiB/s of weights),
and ggml's CUBLAS_COMPUTE_16F call evidently avoids most of that cliff. Vulkan batchd is 36-45% fast: aisim runs
its matmuls on the mat-vec path up to 8 tokens (ggml-vulkan's mul_mat_vec_max_cols), which the 1.7.5 build may
not have had. CUDA single-token decode calls are 56-71% short: they are one or two per 30 s window, each the
first decoder call after an encode, which aisim costs as a steady-state step. The power column is low for CUDA:
the emulated kernels keep the SMs busy at a low achieved throughput, which the activity-based power model reads
as a near-idle GPU. Balanced and Performance differ in the seed only on the CPU (sample time); aisim estimates
both alike. The Power Saver rows are estimates under an assumption (the GPU held to the Max-Q envelope, 35 W and
1245 MHz: hardware_specs/gpus/gtx-1650-mobile.yaml)."""


def dataset_section(name: str, title: str) -> tuple[list[str], list]:
    path = DATA_DIR / name
    lines = read_jsonl(path)
    header = next((line for line in lines if line.get("type") == "header"), {})
    rows = compare(load_measurements([path]))
    parts = [f"## {title}: `validation/data/{name}`",
             f"Measured on {header.get('gpu_count', '?')} x {header.get('gpu_name', '?')}, driver "
             f"{header.get('driver', '?')}, CUDA {header.get('cuda', '?')}, torch {header.get('torch', '?')}, "
             f"transformers {header.get('transformers', '?')}, power limit {header.get('power_limit_w', '?')} W, "
             f"{header.get('date', '?')[:10]}; models built from their configs with random weights.", ""]
    summary = summarize(rows)
    parts += [render_markdown(*summary_table(summary)), ""]
    parts += [_goal_lines(summary, CEILINGS.get(name, {})), "", _subset_line(rows), ""]
    return parts, rows


def _subset_line(rows) -> str:
    """MAPE of runtime over the rows whose GPU work dominates (>= 2048 tokens per step), beside all rows."""
    big = [r for r in rows if r.workload in ("forward", "prefill", "forward-backward", "train")
           and r.batch * r.seq >= GPU_BOUND_TOKENS and r.metrics["runtime_ms"].error is not None]
    if not big:
        return ""
    errors = [abs(r.metrics["runtime_ms"].error) for r in big]
    return (f"GPU-bound subset (forward, prefill and training steps of >= {GPU_BOUND_TOKENS} tokens, tp as measured): "
            f"n = {len(big)}, runtime MAPE {100 * sum(errors) / len(errors):.2f}%, max {100 * max(errors):.2f}%.")


def _goal_lines(summary, ceilings: dict[str, float]) -> str:
    out = ["| Category | Goal (MAPE) | Result | Met | Regression ceiling |", "| :--- | ---: | ---: | :--- | ---: |"]
    for s in summary:
        goal = GOALS.get(s.category)
        if goal is None or s.mape_pct is None:
            continue
        ceiling = ceilings.get(s.category)
        out.append(f"| {s.category} | <= {goal:.0f}% | {s.mape_pct:.2f}% | {'yes' if s.mape_pct <= goal else 'no'} | "
                   f"{f'{ceiling:g}%' if ceiling is not None else '-'} |")
    return "\n".join(out)


def dataset_summaries() -> dict[str, list]:
    """Per committed dataset, the per-category error summary (estimates from the shipped specs)."""
    return {name: summarize(compare(load_measurements([DATA_DIR / name])))
            for name, _ in DATASETS if (DATA_DIR / name).exists()}


def ceiling_violations(summaries: dict[str, list] | None = None) -> list[str]:
    """Every (dataset, category) whose MAPE is over its regression ceiling, or that lost its rows."""
    summaries = dataset_summaries() if summaries is None else summaries
    out = []
    for name, ceilings in CEILINGS.items():
        by_category = {s.category: s for s in summaries.get(name, [])}
        for category, ceiling in ceilings.items():
            s = by_category.get(category)
            if s is None or s.mape_pct is None:
                out.append(f"{name}: {category}: no rows (the ceiling needs them)")
            elif s.mape_pct > ceiling:
                out.append(f"{name}: {category}: MAPE {s.mape_pct:.2f}% > ceiling {ceiling:g}%")
    return out


def studies_sections() -> list[str]:
    """The sections of the studies built on step costs: serving, training, MoE, and the GPU transfer."""
    from .moe_report import engines_section, moe_section
    from .published_train import published_section
    from .serve_report import moe_serve_lines, serve_section, sliding_window_lines, step_mix_lines
    from .train_report import train_section
    from .transfer import transfer_section

    return (["# Serving: transformers continuous batching, measured vs `aisim serve`", "",
             "Command: `aisim validate --reference serve-cb` (python -m aisim.validation.serve_report). Each measured "
             "run (validation/data/serve/cb-*.jsonl: H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130, "
             "transformers 5.17.0, 2026-11-26; random-weight models, EOS disabled) is replayed as a trace through "
             "`aisim serve --runtime transformers-cb`. The engine's host costs come from two microbenchmarks (its batch "
             "preparation; its loop serving a 2-layer model: validation/scripts/derive_cb_host.py), its masked "
             "attention from the sdpa_mask microbenchmark and its copies from the calibration's copy curves, checked "
             "against an H100 profile of its steps; nothing is fitted to these runs.", "", *serve_section(), "",
             SERVE_TEXT, "", *step_mix_lines(), "", *moe_serve_lines(), "", *sliding_window_lines(), ""]
            + ["# Training steps (DDP, FSDP2, precision modes, checkpointing)", "", *train_section(), ""]
            + ["# Published large-scale training table", "", *published_section(), ""]
            + ["# Mixture-of-experts (HF eager on H100)", "", *moe_section(), ""]
            + ["# Engine profiles: HF static cache + torch.compile (graphs), vLLM", "", *engines_section(), ""]
            + ["# GPUs not measured: calibration transfer and datasheet rules", "", *transfer_section(), ""])


SERVE_TEXT = """\
The engine's paged|sdpa attention reads the cache back and repeat_kv expands the KV heads, a copy
from a non-contiguous view that PyTorch runs with its generic elementwise kernel at about 30% of HBM bandwidth;
costed as contiguous copies they made every run 11-22% fast per output token. An H100 profile of the engine's own
steps (validation/data/profiles/cb-*-profile.txt; `python -m aisim.validation.scripts.derive_cb_host --profiles`)
puts them at 43 of 105 ms of kernel time in a 64 x 1024 decode step of Llama-3-8B; aisim now costs them on the
calibration's strided-operand curve. The ~44 ms a step adds on the host when its query/key count is new to the
engine is cuDNN building an SDPA graph (the same profile: 42.7-43.7 ms per call with a new key length, 0.4 ms
repeated); a step whose counts recur reuses the graph (aisim serve: once per shape per replica run). Left:
the Qwen2.5-1.5B offline and 4 req/s runs are short on TTFT (table above): their first 8192-token prefill and first
one-request decode took 0.3-0.7 s more once per process (not in the Llama-3-8B runs; likely a one-time kernel
compilation), and the 4 req/s run's decode steps ran up to a third slower than the same shapes at 16 req/s (host
variance: that model's isolated step measured 44 ms in one session and 35 ms in another)."""


# one row as a user reruns it; the reference itself drops vLLM's memory pool (gptSession allocates its static batch
# whole): three rows (the longest outputs at the largest batches) do not fit vLLM's pool
TRTLLM_ROW_ARGS = ["--model", "Llama-2-7b-hf", "--device", "a100", "--workload", "generate", "--batch", "384",
                   "--seq", "128", "--gen", "128", "--runtime", "vllm"]
TRTLLM_COMMAND = ("Command: `aisim validate --reference trtllm-perf` (one row: `aisim estimate " + " ".join(TRTLLM_ROW_ARGS)
                  + "`; rows whose batch exceeds vLLM's KV pool do not fit under `--runtime vllm` as given: the "
                  "reference prices them without vLLM's pool, as gptSession allocates its static batch whole)")


VLLM_SERVE_TEXT = (
    "aisim's vllm profile prices these runs as an engine at its kernels' speed: its throughputs are 1.4-4.9x the "
    "measured ones, its mean TTFT 29-76% and mean TPOT 5-79% short, on the calibrated H100 more than on the A100. "
    "The same profile's "
    "step costs match TensorRT-LLM's static batches (above) and the GEMMs of a graph-replayed decode step (below), "
    "so these runs point at what aisim leaves out, which of them dominates not known here: the engine's host work "
    "per step with 1,000 requests in flight (V1's scheduler and output processing; the pages' --async-scheduling, "
    "which overlaps part of it, gained 12-16%; vLLM's own micro-benchmark puts update_from_output alone at 0.29 ms "
    "for 256 requests, vllm-project/vllm pull request #46112), the sampler over gpt-oss's 201,088-token vocabulary "
    "for up to 1,000 rows, and gpt-oss's MXFP4 MoE and attention-sink kernels at these shapes (priced by the "
    "default rules); vllm.yaml charges no per-step host time. Not fitted: a cost taken from these rows would be "
    "fitted to the table that judges it. Planners should read --runtime vllm throughput under heavy load as an "
    "upper bound (serve and plan serve say so).")


def build(out: Path) -> str:
    from .report import flat_table

    parts = ["# Accuracy", "",
             f"Generated by `python -m aisim.validation.accuracy` on {date.today().isoformat()} from the datasets "
             "committed under validation/data/ and the reference tables under validation/references/. "
             "Error = (estimated - measured) / measured; MAPE = mean |error|. Calibration files: "
             "hardware_specs/calibration/h100-sxm.yaml and h200.yaml (microbenchmarks only, provenance inside); "
             "RTX A5000/A6000 use the documented default rules (hardware_specs/calibration/default.yaml).", ""]
    all_rows = []
    for name, title in DATASETS:
        if (DATA_DIR / name).exists():
            section, rows = dataset_section(name, title)
            parts += section
            all_rows += [(title, rows)]
    parts += [WHY]
    parts += ["# Published tables (out of sample)", "",
              "## TorchCAP (RTX A5000 / A6000, 1 and 8 GPUs)", "", "Command: `aisim validate --reference torchcap`", "",
              compare_reference("torchcap", fmt="markdown").split("\n", 2)[2], "",
              "Goal: runtime MAPE below TorchCAP's own 7.06% and memory MAPE below 1%, with no parameter taken "
              "from the table. Met for runtime on the 20 rows whose harness is modelled, not over all 24 rows. "
              "The harness is modelled from its source (validation/harness_profiles/torchcap.yaml): the "
              "exported transformers-4.48.2 pass runs SDPA with a materialised causal mask (the masked kernel over "
              "all seq x seq pairs), repeat_kv copies for GQA and its own loss kernels (Llama: fp32 upcast + fp32 "
              "shift copy; OPT: fp16 shift, no upcast), and holds the weights plus the loss tail (plus the logits, "
              "a graph output, on 8 GPUs). RTX A5000 GEMMs use TorchCAP's published matmul microbenchmark of its "
              "benchmark host (0.65 of the datasheet peak, hardware_specs/calibration/rtx-a5000.yaml). Remaining "
              "gaps: (1) the four OPT x 8 rows were uploaded on 2025-04-10/11, before TorchCAP replaced its "
              "multi-GPU script and TP pass on 2025-04-12: they ran the base OPTModel (no LM head, no loss, K/V "
              "cache outputs) under an auto-sharding plan, five passes averaged; a reproduction of that pass "
              "(fake 8-rank group, torch 2.6, validation/scripts/torchcap_tp_graph.py) gives 168 all-reduces per "
              "OPT-1.3b pass and TorchCAP's own estimator puts that graph at 3.9 s, not its published 1.4 s: the "
              "plan that ran is not recoverable from the public source, so these rows are shown but not "
              "modelled (aisim's figure is the MLP-parallel LM pass); (2) clm-60m single-GPU is 12-13% short "
              "(the smallest model, where the per-layer elementwise chain dominates); (3) clm x 8 memory is "
              "0.2-6.3% low, growing with the model (about 3/8 of the MLP weights' size beyond the sharded weights "
              "and the loss tail); TorchCAP's own estimator on the reproduced graph gives the same figures as aisim "
              "(clm-1.1b 8.34 GiB, against its published 8.89), so the extra is in what ran, not in the public "
              "source.", "",
              "## CS336 (batch 4, fp32, forward and forward+backward)", "", "Command: `aisim validate --reference cs336`",
              "", compare_reference("cs336", fmt="markdown").split("\n", 2)[2], "",
              "The course's GPU is not named in that section. No shipped device fits all rows: the H100 "
              "estimates are 25-55% below the measurements and the A100 ones 50-85% above; the course's model "
              "is its own implementation (manual attention, einsum linears), which aisim approximates by the HF "
              "Llama module with the same shapes.", ""]
    parts += ["## TGI serving benchmark (bloomz-7b1-mt, 1-8 shards, int8)", "",
              "Command: `aisim validate --reference tgi-bloomz` (the report itself: `aisim serve-bench --model "
              "bloomz-7b1-mt --device a100 --shards 1,2,4,8 --batch 1,2,4,8,16,32 --seq 1024 --decode-len 8`)", "",
              compare_reference("tgi-bloomz", fmt="markdown").split("\n", 2)[2], "",
              TGI_TEXT, ""]
    parts += ["## whisper.cpp (medium.en on a GTX 1650 laptop GPU, Vulkan and CUDA, power modes)", "",
              "Command: `aisim validate --reference whisper-cpp` (the estimate itself: `aisim estimate --model "
              "whisper-medium.en --device gtx-1650-mobile --workload transcribe --audio-s 61 --beam 5 --runtime "
              "ggml-vulkan [--power-mode power-saver]`)", "",
              compare_reference("whisper-cpp", fmt="markdown").split("\n", 2)[2], "", WHISPER_TEXT, ""]
    parts += ["## TensorRT-LLM's published tables (Llama-2 on H100 FP8, A100 FP16, L40S FP8)", "",
              TRTLLM_COMMAND + ". Out of sample "
              "for the GPUs aisim never measured (issue 12: published decode throughputs of a deployed engine): "
              "A100 and L40S run on the default rules and their datasheets.", "",
              compare_reference("trtllm-perf", fmt="markdown").split("\n", 2)[2], ""]
    parts += ["## vLLM serving under load (GPUStack's gpt-oss-20b runs on A100 and H100)", "",
              "Command: `aisim validate --reference vllm-serve` (one row: `aisim serve -m gpt-oss-20b -d h100 "
              "--runtime vllm --num-requests 500 --input-len 3998 --output-len 105 --rate inf`). Out of sample for "
              "issue 16 (the engines people deploy, MoE) and, on the A100, issue 12: vLLM's own serving of an MoE "
              "model with every request at once, measured by a third party. " + VLLM_SERVE_TEXT, "",
              compare_reference("vllm-serve", fmt="markdown").split("\n", 2)[2], ""]
    parts += studies_sections()
    parts += ["# All measured rows", ""]
    for title, rows in all_rows:
        parts += [f"## {title}", "", render_markdown(*flat_table(rows)), ""]
    text = "\n".join(parts)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


app = new_app(__doc__.split("\n")[0])


@app.command()
def _accuracy(out: Path = typer.Option(Path("docs/accuracy.md"), help="the document to write")) -> int:
    build(out)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(app, argv, "python -m aisim.validation.accuracy")


if __name__ == "__main__":
    raise SystemExit(main())
