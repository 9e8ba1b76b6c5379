"""Stand-alone GPU measurement scripts (one process each), run as ``python3 -m aisim.validation.harness.NAME``.

- ``serve_cb``: transformers' continuous-batching engine (offline, Poisson arrivals, single-step batch mixes)
- ``train_step``: training steps, 1 GPU plain and 2 GPUs DDP / FSDP2, bf16-mixed and bf16-true, OOM recorded
- ``moe_bench``: HF MoE models (OLMoE, Qwen-MoE) prefill / decode, routing statistics, kernel profile
- ``graphs_decode``: static cache + ``torch.compile(mode="reduce-overhead")`` decode
- ``fp8_gemm``: ``torch._scaled_mm`` fp8 vs bf16 matmul

``run_all.sh`` (one GPU) and ``run_train.sh`` (two GPUs) run them under a time budget into ``$OUT``. Every script
writes JSONL (a provenance header line, then one line per finished case, flushed), takes ``--max-minutes`` and
``--smoke`` (a tiny configuration on the CPU, used by tests/test_harness_cpu.py). Only ``aisim.validation.gpu`` is
imported from the package (no pydantic), so the scripts run on machines that have torch and transformers only.
"""
