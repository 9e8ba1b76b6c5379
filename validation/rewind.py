"""The validation harnesses' untimed KV-cache rewind between decode steps, and the head start it gives the host.

validation/measure.py (``_decode``: ``after()``) and validation/harness/moe_bench.py (``prepare``: ``after()``, timed
by harness/common.py ``time_steps``) time one decode step between two CUDA events, then, untimed, crop the cache back
(``DynamicCache.crop(-1)``: a view with a gap per head row) and make every layer's K and V contiguous again, and
record the next step's start event: with no synchronize in between. The copies are queued behind the step; the host
returns from issuing them at once and starts issuing the next step while the GPU still copies, and that step's start
event sits behind the copies. A step whose host time sets the pace is therefore timed short by the head start: the
copies' GPU time less the host time that issued them. Such a row measures max(GPU busy time, runtime - head start),
not the runtime a generation loop (which synchronizes every step on its next token) sees. A distributed run
synchronizes before every trial (measure.py ``_barrier``): no head start there. Encoder-decoder rows (whisper's
decoder steps rewind their self-attention cache the same way) are left as estimated: the estimate's KV figure holds
the cross-attention cache too, which the rewind does not copy.

The copies' speed is measured, not assumed: validation/harness/eager_attention.py ``crop_contiguous`` rows (the same
crop and copy on a (batch, 32, seq + 1, 128) cache), fitted as t = t0 + bytes / rate (relative-error least squares
over the 16-bit rows). H100: 1.66 TB/s (0.49 of the datasheet bandwidth: a copy from a strided view). The H200
datasets take the H100 fit (the H200 run predates the crop rows, and the later call for an H200 was lent an H100;
the strided-input kernels measured on both ran at the same per-SM rate, eager-attention-h200.jsonl's cat rows).
The host issues each copy at the machine's own calibration: a clone and a slice per tensor (eager_op_host_ratio).

The head start models the measurement (this harness on the machine that ran it), so validation/transfer.py applies
the same one in every column, the leave-one-GPU-out and --calibration none ones included: those columns test the
estimate of the step, not of the harness around it.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "kernels"
REWIND_DATA = {"h100-sxm": DATA / "eager-attention-h100.jsonl", "h200": DATA / "eager-attention-h100.jsonl"}
REWIND_OP = "crop_contiguous"
HOST_OPS = ("aten.clone", "aten.slice.Tensor")     # per tensor: crop's slice, contiguous()'s copy


@functools.cache
def rewind_fit(gpu: str) -> tuple[float, float] | None:
    """(t0 seconds, bytes per second) of one crop + contiguous copy on ``gpu``, or None without data."""
    path = REWIND_DATA.get(gpu)
    if path is None or not path.is_file():
        return None
    return crop_copy_fit([r for r in map(json.loads, path.read_text().splitlines()) if r.get("type") == "case"])


def crop_copy_fit(rows: list[dict]) -> tuple[float, float] | None:
    """(t0 seconds, bytes per second) of t = t0 + bytes / rate over the eager_attention harness's 16-bit
    ``crop_contiguous`` case rows (relative-error least squares), None with fewer than 4."""
    from .calibrate_fit import fit_fixed_plus_linear

    rows = [r for r in rows if r.get("op") == REWIND_OP and r.get("status") == "ok"
            and r.get("dtype") in ("fp16", "bf16")]
    if len(rows) < 4:
        return None
    t0, per_byte = fit_fixed_plus_linear([r["median_ms"] * 1e-3 for r in rows], [r["bytes"] for r in rows])
    return max(t0, 0.0), 1.0 / per_byte


def head_start_s(config: dict, kv_bytes: float, gpu: str) -> float:
    """The host's head start on a decode step measured after the rewind of a cache of ``kv_bytes`` per GPU (every
    layer's K and V copied once), 0 where there is nothing to copy or no measured copy speed."""
    from aisim.graph.build import layer_count
    from aisim.specs import load_calibration

    fit = rewind_fit(gpu)
    if not fit or kv_bytes <= 0 or config.get("is_encoder_decoder"):
        return 0.0
    t0, rate = fit
    tensors = 2 * layer_count(config)
    per_tensor = kv_bytes / tensors
    gpu_s = tensors * (t0 + 2 * per_tensor / rate)          # the view read, the copy written
    cal = load_calibration(gpu)
    if cal.eager_add_dispatch_s is not None:
        per_call = cal.eager_add_dispatch_s * sum(cal.eager_op_host_ratio.get(op, 1.0) for op in HOST_OPS)
    else:                   # a clone at the kernel-op cost, the slice (a view) at the view cost
        per_call = (cal.eager_kernel_dispatch_s or cal.eager_dispatch_s) + (cal.eager_view_dispatch_s
                                                                            or cal.eager_dispatch_s)
    return max(gpu_s - tensors * per_call, 0.0)


def measured_runtime_s(runtime_s: float, gpu_busy_s: float, head_start: float) -> float:
    """What the harness times: the GPU's busy time where it sets the pace, else the runtime less the head start."""
    return max(gpu_busy_s, runtime_s - head_start) if head_start > 0 else runtime_s


def rewind_note(gpu: str = "h100-sxm") -> str:
    fit = rewind_fit(gpu)
    if fit is None:
        return ""
    return (f"crop + contiguous copy {fit[1] / 1e12:.2f} TB/s + {fit[0] * 1e6:.1f} us per tensor "
            f"({REWIND_DATA[gpu].relative_to(DATA.parent.parent.parent)})")

