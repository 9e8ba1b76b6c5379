"""Microbenchmark of one bitsandbytes LLM.int8 linear layer against fp16 (validates aisim.graph.engine's expansion).

Run on a GPU machine with bitsandbytes installed: python -m aisim.validation.scripts.bnb_int8_bench OUT.json
Each shape: Linear8bitLt(has_fp16_weights=False, threshold=6.0) and nn.Linear in fp16, input rows with 6 outlier
columns (magnitude 8, above the threshold, as LLM.int8 sees in 6.7B+ models); median of 5 windows of 50 calls
timed wall-clock after a synchronize (CPU-side work counts, as in a served model).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

SHAPES = [(1, 4096, 4096), (1, 4096, 16384), (100, 4096, 4096), (800, 4096, 16384), (3200, 4096, 4096)]


def _time(fn, calls: int = 50, windows: int = 5) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(out)


def main(path: str) -> None:
    import torch

    record = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": []}
    try:
        import bitsandbytes as bnb
        record["bitsandbytes"] = bnb.__version__
    except Exception as exc:  # noqa: BLE001 - recorded, nothing to measure
        record["error"] = f"bitsandbytes unavailable: {type(exc).__name__}: {exc}"
        json.dump(record, open(path, "w"), indent=1)
        print(record["error"])
        return
    for m, k, n in SHAPES:
        x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        x[:, :6] = 8.0
        dense = torch.nn.Linear(k, n, dtype=torch.float16, device="cuda")
        int8 = bnb.nn.Linear8bitLt(k, n, has_fp16_weights=False, threshold=6.0)
        int8.load_state_dict(dense.state_dict())
        int8 = int8.cuda()
        with torch.inference_mode():
            row = {"m": m, "k": k, "n": n, "fp16_ms": _time(lambda: dense(x)), "int8_ms": _time(lambda: int8(x))}
        record["rows"].append(row)
        print(row, flush=True)
    json.dump(record, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
