"""The ``aisim`` command line: parse, call the API, render. No modelling here; heavy imports happen lazily."""
from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path
from typing import Optional

import typer

from .errors import AisimError, DoesNotFit

# torch's import of the deprecated pynvml package warns on every run; it says nothing about the estimate
warnings.filterwarnings("ignore", message="The pynvml package is deprecated")

# rich's option tables crop long option names and values below 110 columns ("--max-num-batched…"), and rich prints
# 80 columns into a pipe or file: a narrow terminal, a pipe or a file gets click's plain help, which wraps instead
# (the width is $COLUMNS or the terminal's; 0 when there is neither)
HELP_MARKUP = "rich" if shutil.get_terminal_size((0, 0)).columns >= 110 else None
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=HELP_MARKUP,
                  help="aisim: estimate runtime, memory, energy and throughput of transformer models on GPUs.")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


# exit status of an answer that is "no": the configuration does not fit, or no candidate meets the goals (the
# answer is printed; 2 is bad input, 0 an answer that fits), so a script can branch on it as on grep's "no match"
EXIT_NO_FIT = 1


def _exit_if(no_fit: bool) -> None:
    if no_fit:
        raise typer.Exit(EXIT_NO_FIT)


# image formats matplotlib writes without extra packages, by file suffix (the plots pick the format from it)
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def _output_path(path: Optional[Path], flag: str) -> None:
    """Fail before any work when an output file cannot be written: its folder missing, or not writable; a plot's
    suffix not an image format."""
    import os

    if path is None:
        return
    if flag == "--plot" and path.suffix.lower() not in PLOT_SUFFIXES:
        _fail(f"{flag} {path}: the suffix picks the image format; end the name in one of {', '.join(PLOT_SUFFIXES)}")
    folder = path.expanduser().parent
    if not folder.is_dir():
        _fail(f"{flag} {path}: folder {folder} does not exist; create it or give another path")
    if path.is_dir():
        _fail(f"{flag} {path}: is a folder; give a file name")
    if not os.access(folder, os.W_OK):
        _fail(f"{flag} {path}: folder {folder} is not writable; give another path")


def _run(fn, *args, json_no_fit: bool = False, **kwargs):
    """Call ``fn``; bad input becomes a one-line error and exit code 2, never a traceback; a configuration that does
    not fit, its one line and exit code 1 (EXIT_NO_FIT), and with ``json_no_fit`` (--json) also a JSON object on
    stdout ({"fits": false, ...}, as estimate --json prints its result) so a script reads the answer."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(*args, **kwargs)
        return result, [str(w.message) for w in caught if "aisim" in str(w.filename) or w.category is UserWarning]
    except DoesNotFit as exc:      # an answer, not bad input
        typer.echo(str(exc), err=True)
        if json_no_fit:
            import json
            typer.echo(json.dumps({"fits": False, "does_not_fit": exc.detail, "hint": exc.hint}, indent=2))
        raise typer.Exit(EXIT_NO_FIT) from None
    except AisimError as exc:
        _fail(str(exc))


@app.command()
def estimate(
    model: str = typer.Option(..., "--model", "-m", help="shipped name (opt-6.7b, llama-3-70b, facebook/opt-6.7b) "
                              "or a config.json path"),
    device: str = typer.Option(..., "--device", "-d", help="GPU name, NAMExN for N GPUs in one host (a6000x8), a "
                               "system name, or a GPU/system YAML path"),
    workload: str = typer.Option("forward", help="forward, prefill, decode, generate, encode, forward-backward, "
                                 "train or transcribe (speech models: a recording, in whisper.cpp's phases)"),
    batch: int = typer.Option(1, help="batch size"),
    seq: int = typer.Option(1024, help="input length; for decode the context length"),
    gen: Optional[int] = typer.Option(None, help="generate: new tokens [default: 128]"),
    dtype: Optional[str] = typer.Option(None, help="fp32|tf32|fp16|bf16|auto (as the runtime picks it from "
                                        "config.json) [default: fp16; train: --precision's, bf16-mixed]"),
    tp: Optional[int] = typer.Option(None, help="tensor parallel degree (default: the most GPUs of one node "
                                     "that divide the model's heads and widths, the rest data parallel; "
                                     "across nodes or past the KV heads (vllm) only where nothing else takes the "
                                     "batch; training with --zero 1-3 or --fsdp: data parallel first; plain DDP "
                                     "training: the fastest split of a node whose replicas fit, each costed)"),
    pp: int = typer.Option(1, help="pipeline parallel degree"),
    dp: Optional[int] = typer.Option(None, help="data parallel degree (default: GPUs / (tp x pp))"),
    tp_scope: str = typer.Option("all", help="all (attention+MLP; + the vocabulary under vllm and in training, as "
                                 "Megatron) | full (+ vocab-parallel LM head) | layers (attention+MLP, the "
                                 "vocabulary replicated) | mlp | attention"),
    ep: int = typer.Option(1, "--ep", help="MoE expert parallel degree: experts spread over N of the tp x dp GPUs"),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="KV cache dtype: auto (model dtype) | fp16 | bf16 | fp8"),
    runtime: Optional[str] = typer.Option(None, help="eager (default; ggml-cuda for transcribe), graphs, vllm, "
                                          "kernel-sum, ggml-cuda, ggml-vulkan, tgi-2023 (aisim list runtimes)"),
    calibration: str = typer.Option("auto", help="auto (the GPU's calibration file, else default rules) | none "
                                    "(datasheet rules only) | PATH to a calibration YAML"),
    host: Optional[Path] = typer.Option(None, help="host YAML from `aisim calibrate --host-only`: that machine's "
                                        "eager CPU costs replace the calibration's"),
    with_loss: bool = typer.Option(False, "--with-loss", help="forward includes the LM loss over all logits"),
    optimizer: str = typer.Option("adamw", help="train: adamw|sgd"),
    quant: str = typer.Option("none", help="weight quantization: none|bitsandbytes-int8|int8|fp8|int4"),
    audio_s: Optional[float] = typer.Option(None, "--audio-s", help="transcribe: seconds of audio"),
    beam: int = typer.Option(5, help="transcribe: beam size"),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="transcribe: output tokens (default: assumed "
                                         "speech rate)"),
    windows: Optional[int] = typer.Option(None, help="transcribe: 30 s windows encoded (default ceil(audio/30))"),
    step_tokens: int = typer.Option(1, "--step-tokens", help="decode of an encoder-decoder model: new tokens per "
                                    "row in the call (a whisper.cpp prompt call: --step-tokens = --seq)"),
    static_cache_len: Optional[int] = typer.Option(None, "--static-cache-len", help="--runtime graphs decode/generate: "
                                                   "HF StaticCache max_cache_len, the keys every step attends over "
                                                   "(default: --seq; generate: --seq + --gen)"),
    power_mode: Optional[str] = typer.Option(None, "--power-mode", help="a power mode the GPU's spec file names "
                                             "(gtx-1650-mobile: performance, balanced, power-saver)"),
    power_limit: Optional[float] = typer.Option(None, "--power-limit", help="board power limit in W"),
    gpu_clock: Optional[float] = typer.Option(None, "--gpu-clock", help="GPU core clock cap in MHz"),
    precision: Optional[str] = typer.Option(None, help="train: bf16-mixed | 16-mixed | bf16-true | 16-true | "
                                            "32-true (Lightning's names; default: --dtype's true precision, "
                                            "bf16-mixed without --dtype)"),
    zero: int = typer.Option(0, help="train: ZeRO stage 0 (plain DDP) | 1 | 2 | 3 (= FSDP FULL_SHARD)"),
    fsdp: str = typer.Option("none", help="train: none | full | grad-op | hybrid (FSDP sharding strategy)"),
    recompute: str = typer.Option("none", help="train: activation checkpointing none | selective | full"),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="train: sequences per micro-batch per "
                                              "data-parallel replica (--batch stays the global batch)"),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="train: micro-batches per step"),
    pp_schedule: str = typer.Option("1f1b", "--pp-schedule", help="train: 1f1b | interleaved"),
    virtual_stages: int = typer.Option(2, "--virtual-stages", help="train: interleaved: model chunks per stage"),
    bucket_mb: float = typer.Option(25.0, "--bucket-mb", help="train: DDP gradient bucket size in MiB"),
    optimizer_impl: str = typer.Option("fused", "--optimizer-impl", help="train: AdamW fused | foreach"),
    nodes: Optional[int] = typer.Option(None, help="train: nodes of a multi-node system (a100x8-hdr, h100x8-ndr)"),
    token_budget: Optional[float] = typer.Option(None, "--token-budget", help="train: tokens, for the time to "
                                                 "train"),
    as_json: bool = typer.Option(False, "--json", help="print the stable JSON object"),
):
    """Estimate one workload step of MODEL on DEVICE (train: one optimizer step of the training plan)."""
    from . import report
    from .api import estimate as run_estimate

    if workload == "train" and dtype is None and precision is None:
        precision = "bf16-mixed"          # plan train's and Lightning's common choice, not 16-true
    if workload == "train":
        _check_precision_dtype(precision, dtype)
    dtype = dtype or "fp16"
    train_plan = _train_plan(model, workload, dtype, precision, zero, fsdp, recompute, micro_batch, grad_accum,
                             pp_schedule, virtual_stages, bucket_mb, optimizer_impl)

    result, notes = _run(run_estimate, model=model, device=device, workload=workload, batch=batch, seq=seq,
                         gen=gen, dtype=dtype, tp=tp, pp=pp, dp=dp, tp_scope=tp_scope, runtime=runtime,
                         calibration=calibration, with_loss=with_loss, optimizer=optimizer, quant=quant,
                         audio_s=audio_s, beam=beam,
                         transcript_tokens=tokens, windows=windows, power_mode=power_mode,
                         power_limit_w=power_limit, gpu_clock_mhz=gpu_clock, step_tokens=step_tokens, ep=ep,
                         kv_dtype=kv_dtype, train=train_plan, nodes=nodes, token_budget=token_budget,
                         static_cache_len=static_cache_len, host=host)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        report.print_estimate(result, notes)
    _exit_if(result.fits is False)


def _check_precision_dtype(precision: str | None, dtype: str | None) -> None:
    """A training step's --dtype, where given, must be its --precision's (which sets the dtype there)."""
    from .studies.train import PRECISION_DTYPE

    asked = {"tf32": "fp32"}.get(dtype, dtype)
    if precision in PRECISION_DTYPE and dtype not in (None, "auto") and PRECISION_DTYPE[precision] != asked:
        same = sorted(p for p, d in PRECISION_DTYPE.items() if d == asked)
        _fail(f"--dtype {dtype} conflicts with --precision {precision} ({PRECISION_DTYPE[precision]}): in training "
              f"--precision sets the dtype; drop --dtype or give a precision in {dtype} ({', '.join(same)})")


def _train_plan(model, workload, dtype, precision, zero, fsdp, recompute, micro_batch, grad_accum, pp_schedule,
                virtual_stages, bucket_mb, optimizer_impl):
    """The TrainPlan the training flags give (None for other workloads; a training flag there is an error)."""
    from .scenario import build_request
    from .workload import TrainPlan

    given = {"precision": precision, "zero": zero or None, "fsdp": None if fsdp == "none" else fsdp,
             "recompute": None if recompute == "none" else recompute, "micro_batch": micro_batch,
             "grad_accum": grad_accum, "pp_schedule": None if pp_schedule == "1f1b" else pp_schedule,
             "bucket_mb": None if bucket_mb == 25.0 else bucket_mb,
             "optimizer_impl": None if optimizer_impl == "fused" else optimizer_impl,
             "virtual_stages": None if virtual_stages == 2 else virtual_stages}
    if workload != "train":
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            _fail(f"--{extra[0].replace('_', '-')} applies to --workload train only")
        return None
    if given["virtual_stages"] is not None and pp_schedule != "interleaved":
        _fail("--virtual-stages applies to --pp-schedule interleaved (model chunks per pipeline stage); add it or "
              "drop --virtual-stages")
    from .studies.train import default_precision

    try:
        return build_request(TrainPlan, precision=precision or default_precision(dtype, model), zero=zero,
                             fsdp=fsdp, recompute=recompute, micro_batch=micro_batch, grad_accum=grad_accum,
                             pp_schedule=pp_schedule, virtual_stages=virtual_stages, bucket_mb=bucket_mb,
                             optimizer_impl=optimizer_impl)
    except AisimError as exc:
        _fail(str(exc))


@app.command()
def trace(
    model: str = typer.Option(..., "--model", "-m"),
    workload: str = typer.Option("forward"),
    batch: int = typer.Option(1),
    seq: int = typer.Option(1024),
    dtype: str = typer.Option("fp16"),
    device: str = typer.Option("h100", help="device used for the time share column"),
    as_json: bool = typer.Option(False, "--json"),
):
    """The traced operator table: count, FLOPs, bytes and share of time per aten op."""
    from . import report
    from .api import estimate as run_estimate

    result, _ = _run(run_estimate, model=model, device=device, workload=workload, batch=batch, seq=seq,
                     dtype=dtype, top_ops=None)
    if as_json:
        import json
        typer.echo(json.dumps({"model": result.model, "unknown_ops": result.unknown_ops,
                               "ops": [r.model_dump() for r in result.top_ops]}, indent=2))
    else:
        report.print_op_table(result)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        _fail(f"{flag} takes comma-separated integers, e.g. 1,2,4,8 (got {text!r})")
    if not values or min(values) < 1:
        _fail(f"{flag} needs at least one positive integer (got {text!r})")
    return values


@app.command("serve-bench")
def serve_bench(
    model: str = typer.Option(..., "--model", "-m"),
    device: str = typer.Option(..., "--device", "-d", help="the GPU kind of the node (a100-sxm4-80gb, h100, ...)"),
    shards: str = typer.Option("1,2,4,8", help="tensor-parallel shard counts"),
    batch: str = typer.Option("1,2,4,8,16,32", help="batch sizes"),
    seq: int = typer.Option(1024, help="prompt length"),
    decode_len: int = typer.Option(8, help="generated tokens (1 from prefill + decode_len - 1 steps)"),
    dtype: str = typer.Option("auto", help="auto (as the engine picks it from config.json's torch_dtype and the "
                              "GPU, as serve does) | fp16 | bf16 | fp32"),
    quant: str = typer.Option("none", help="none|bitsandbytes-int8|int8|fp8|int4"),
    runtime: str = typer.Option("tgi-2023", help="engine profile (aisim list runtimes)"),
    max_batch_total_tokens: Optional[int] = typer.Option(None, help="server limit on batch x (seq + decode)"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Prefill and decode latency and throughput per shard count and batch size (TGI benchmark layout)."""
    from . import report
    from .api import checked
    from .scenario import ScenarioRequest, build_request
    from .studies.serve_bench import ServeBenchRequest
    from .studies.serve_bench import serve_bench as run_bench

    def bench():
        base = build_request(ScenarioRequest, model=model, device=device, dtype=dtype, quant=quant, runtime=runtime)
        req = build_request(ServeBenchRequest, shards=_ints(shards, "--shards"), batches=_ints(batch, "--batch"),
                            seq=seq, decode_len=decode_len, max_batch_total_tokens=max_batch_total_tokens)
        return checked(run_bench(base, req))

    result, _ = _run(bench)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        report.print_serve_bench(result)


# serve and plan serve without --runtime: the engine this project measures, said so (its decode steps under load are
# several times vLLM's)
DEFAULT_ENGINE_NOTE = ("--runtime not given: transformers-cb, transformers' continuous batching (the engine measured "
                       "here: docs/accuracy.md, serving); for a vLLM deployment give --runtime vllm")


def _given(ctx: typer.Context, *names: str) -> tuple[str, ...]:
    """The flags of ``names`` that the command line gave (not their defaults). The source is compared by name:
    typer may carry its own copy of click's ParameterSource enum."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return tuple(flags[n] for n in names if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE")


def _goodput_nargs(goodput: str, extra: list[str]) -> str:
    """vLLM's --goodput takes its KEY:MS pairs as separate words (nargs='+'): the words after the first that typer
    leaves over join it; any other leftover word is an error."""
    pairs = [a for a in extra if ":" in a and not a.startswith("-")]
    if extra and (not goodput or len(pairs) != len(extra)):
        _fail(f"unexpected argument(s): {' '.join(extra)}; every input is an option (aisim serve --help)")
    return " ".join([goodput, *pairs]) if pairs else goodput


@app.command(context_settings={"allow_extra_args": True})
def serve(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", "-m", help="shipped name or config.json path"),
    device: str = typer.Option(..., "--device", "-d", help="GPU, NAMExN or system; GPUs beyond tp x pp hold replicas"),
    dtype: str = typer.Option("auto", help="auto (as the engine picks it from config.json's torch_dtype and the "
                              "GPU) | fp16 | bf16 | fp32"),
    tp: Optional[int] = typer.Option(None, help="tensor parallel degree of a replica (default: 1; on a device of "
                                     "several GPUs the smallest power of two a replica fits at)"),
    pp: int = typer.Option(1, help="pipeline parallel degree of a replica"),
    ep: int = typer.Option(1, "--ep", help="MoE expert parallel degree: experts spread over ep GPUs (within a "
                           "replica's tp GPUs, or, vllm, beyond them over data-parallel ranks stepping together: "
                           "DP+EP)"),
    quant: str = typer.Option("none", help="weight quantization: none|int8|fp8|int4"),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="KV cache dtype: auto (model dtype) | fp16 | bf16 | fp8"),
    runtime: str = typer.Option("transformers-cb", help="engine profile with a serving section: transformers-cb, "
                                "vllm (aisim list runtimes)"),
    calibration: str = typer.Option("auto", help="auto | none | PATH"),
    num_requests: int = typer.Option(1000, "--num-requests", help="requests to simulate"),
    input_len: str = typer.Option("sharegpt", "--input-len", help="N, uniform:LO:HI, normal:MEAN:SD, "
                                  "lognormal:MEAN:SIGMA or sharegpt"),
    output_len: str = typer.Option("sharegpt", "--output-len", help="as --input-len"),
    rate: float = typer.Option(float("inf"), help="mean requests/s over all replicas (Poisson); inf = all at once"),
    arrival: str = typer.Option("poisson", help="poisson or gamma:CV"),
    seed: int = typer.Option(0),
    trace_file: Optional[Path] = typer.Option(None, "--trace", help="CSV or JSONL: arrival_s,input_tokens,"
                                              "output_tokens (replaces the length and arrival options)"),
    replicas: Optional[int] = typer.Option(None, help="engine replicas (default: GPUs / (tp x pp))"),
    router: str = typer.Option("round-robin", help="round-robin | least-loaded"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens"),
    block_size: Optional[int] = typer.Option(None, "--block-size"),
    gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization"),
    num_gpu_blocks_override: Optional[int] = typer.Option(
        None, "--num-gpu-blocks-override", help="KV blocks per GPU instead of the memory policy's (vLLM's flag; "
        "transformers CB: ContinuousBatchingConfig.num_blocks)"),
    chunked_prefill: Optional[bool] = typer.Option(None, "--chunked-prefill/--no-chunked-prefill"),
    preemption_mode: Optional[str] = typer.Option(None, "--preemption-mode", help="recompute | swap"),
    prefix_caching: Optional[bool] = typer.Option(
        None, "--enable-prefix-caching/--no-enable-prefix-caching", help="vLLM's flag (on by default in V1): a "
        "request preempted by recompute takes back its prefix blocks still cached"),
    percentiles: str = typer.Option("50,90,99", "--metric-percentiles", help="vLLM's flag (its default is 99)"),
    goodput: str = typer.Option("", "--goodput", help="as vLLM's: per-request limits KEY:MS for ttft, tpot, e2el "
                                "(e.g. ttft:300 tpot:50, quoted or not): adds Request goodput (req/s)"),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", help="as vLLM's: the client keeps at "
                                                  "most this many requests in flight (a request's latencies count "
                                                  "from when it is sent)"),
    per_request: Optional[Path] = typer.Option(None, "--per-request", help="write one CSV row per request"),
    save_result: Optional[Path] = typer.Option(None, "--save-result", help="write the run as vLLM bench serve's "
                                               "--save-result JSON (flat: its keys and per-request lists)"),
    as_json: bool = typer.Option(False, "--json", help="print the vLLM bench-serve style JSON"),
):
    """Simulate a continuous-batching server under a request load (vLLM bench-serve metrics)."""
    from . import report
    from .studies.serve.cli_run import run_serve

    goodput = _goodput_nargs(goodput, ctx.args)

    def go():
        return run_serve(model=model, device=device, dtype=dtype, tp=tp, pp=pp, ep=ep, quant=quant, kv_dtype=kv_dtype,
                         runtime=runtime,
                         calibration=calibration, num_requests=num_requests, input_len=input_len,
                         output_len=output_len, rate=rate, arrival=arrival, seed=seed, trace=trace_file,
                         replicas=replicas, router=router, percentiles=percentiles, goodput=goodput,
                         max_concurrency=max_concurrency,
                         progress=not as_json,
                         ignored=_given(ctx, "num_requests", "input_len", "output_len", "rate", "arrival", "seed"),
                         knobs={"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                                "block_size": block_size, "gpu_memory_utilization": gpu_memory_utilization,
                                "num_gpu_blocks_override": num_gpu_blocks_override,
                                "enable_chunked_prefill": chunked_prefill, "preemption_mode": preemption_mode,
                                "enable_prefix_caching": prefix_caching})

    _output_path(per_request, "--per-request")
    _output_path(save_result, "--save-result")
    (result, run, notes), _ = _run(go, json_no_fit=as_json)
    if not _given(ctx, "runtime"):
        notes = [DEFAULT_ENGINE_NOTE, *notes]
        result = result.model_copy(update={"assumptions": [DEFAULT_ENGINE_NOTE, *result.assumptions]})
    if per_request is not None:
        from .studies.serve import write_requests_csv
        _run(write_requests_csv, run.requests, per_request)
    if save_result is not None:
        _run(_write_vllm_result, save_result, result, run)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        report.print_serve(result, notes)


def _write_vllm_result(path: Path, result, run) -> None:
    import json
    from datetime import datetime

    from .studies.serve.metrics import vllm_result

    load = result.load
    header = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": f"aisim-{result.runtime}",
              "model_id": result.model, "device": result.device, "num_prompts": load.get("num_prompts"),
              "request_rate": load.get("request_rate"), "burstiness": load.get("burstiness", 1.0),
              "max_concurrency": load.get("max_concurrency")}
    data = vllm_result(run.requests, run.token_time_s, run.token_request_id, run.result, header)
    try:
        path.write_text(json.dumps(data))
    except OSError as e:
        raise AisimError(f"cannot write --save-result {path}: {e.strerror}") from None


plan_app = typer.Typer(no_args_is_help=True, rich_markup_mode=HELP_MARKUP,
                       help="Capacity planning: search configurations that meet SLOs.")
app.add_typer(plan_app, name="plan")


def _prices(items: list[str], price_file: Optional[Path] = None) -> dict[str, float]:
    """GPU -> USD per GPU-hour: a price file (YAML or JSON mapping of GPU names to prices), then --price items."""
    from .catalog import resolve_gpu

    pairs: list[tuple[str, object]] = []
    if price_file is not None:
        import yaml

        try:
            data = yaml.safe_load(price_file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            _fail(f"--price-file {price_file}: not readable YAML/JSON ({type(exc).__name__})")
        if not isinstance(data, dict):
            _fail(f"--price-file {price_file}: give a mapping of GPU names to USD per GPU-hour, e.g. h100: 2.5")
        pairs += list(data.items())
    pairs += [tuple(item.partition("=")[::2]) for item in items]
    out = {}
    for name, value in pairs:
        try:
            price = float(value)
        except (TypeError, ValueError):
            _fail(f"price {name}={value!r}: give GPU=USD_PER_GPU_HOUR, e.g. --price h100=2.5")
        if not 0 < price < 1e4:
            _fail(f"price {name}={value!r}: a GPU-hour price must be positive (USD)")
        try:
            out[resolve_gpu(str(name)).name] = price
        except AisimError as exc:
            _fail(str(exc))
    return out


def _write_or_fail(path: Path, write, *args) -> None:
    """``write(*args)`` of the file ``path``, an OS error (disk full, permissions) as a one-line error."""
    try:
        write(*args)
    except OSError as exc:
        _fail(f"cannot write {path}: {exc.strerror}")


def _write_rows(path: Path, rows: list) -> None:
    import csv

    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


@plan_app.command("serve")
def plan_serve_cmd(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", "-m"),
    devices: str = typer.Option("h100,a100,l4", help="comma-separated GPUs, or all"),
    runtimes: str = typer.Option("transformers-cb", "--runtimes", "--runtime",
                                 help="comma-separated engine profiles with a serving section, e.g. vllm,"
                                 "transformers-cb (--runtime is the same option, as `aisim serve` spells it)"),
    rate: float = typer.Option(..., help="requests per second to serve"),
    input_len: str = typer.Option("sharegpt", "--input-len", help="prompt tokens: N, uniform:LO:HI, normal:MEAN:SD, "
                                  "lognormal:MEAN:SIGMA or sharegpt (as serve's)"),
    output_len: str = typer.Option("sharegpt", "--output-len", help="output tokens, as --input-len"),
    slo: str = typer.Option("", help="e.g. ttft_p90_ms=2000,tpot_p50_ms=50 (any percentile; mean_/median_ too)"),
    max_gpus: int = typer.Option(8, "--max-gpus", help="GPUs per device and runtime, at most (tp x replicas)"),
    dtype: str = typer.Option("auto", help="auto (per GPU, as the engine picks it from config.json's torch_dtype: "
                              "vLLM runs bf16 checkpoints in fp16 on GPUs without bf16) | fp16 | bf16 | fp32"),
    quant: str = typer.Option("none", help="weight quantization of every candidate: none|int8|fp8|int4"),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="KV cache dtype of every candidate: auto | fp16 | bf16 | "
                                 "fp8"),
    num_requests: int = typer.Option(400, "--num-requests", help="requests per simulation"),
    arrival: str = typer.Option("poisson", help="poisson or gamma:CV (CV > 1: bursty arrivals), as serve's"),
    tp: str = typer.Option("", "--tp", help="comma-separated tensor-parallel degrees of a replica to search "
                           "(default: 1, 2, 4, 8 and each power of two up to --max-gpus)"),
    expert_parallel: bool = typer.Option(False, "--enable-expert-parallel",
                                         help="MoE: experts spread over each replica's tp GPUs, as vLLM's flag"),
    power_limit: Optional[float] = typer.Option(None, "--power-limit", help="board power limit of every GPU in W"),
    gpu_clock: Optional[float] = typer.Option(None, "--gpu-clock", help="GPU core clock cap in MHz"),
    price: list[str] = typer.Option([], "--price", help="GPU=USD per GPU-hour (repeatable)"),
    price_file: Optional[Path] = typer.Option(None, "--price-file", help="YAML/JSON mapping GPU -> USD per GPU-hour"),
    electricity: float = typer.Option(0.10, "--electricity-usd-per-kwh"),
    pue: float = typer.Option(1.2, "--pue", help="power usage effectiveness of the data center (kWh/day x PUE)"),
    grid: Optional[float] = typer.Option(None, "--grid-g-co2-per-kwh"),
    csv_out: Optional[Path] = typer.Option(None, "--csv", help="write the ranked table as CSV"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write the Pareto front as png, pdf, svg or jpg (needs "
                                        "matplotlib)"),
    as_json: bool = typer.Option(False, "--json"),
):
    """The cheapest configuration per GPU that serves RATE requests/s within the SLOs."""
    from . import report
    from .studies.plan_serve import parse_slo, plan_request, plan_serve

    def go():
        req = plan_request(model=model, devices=[d.strip() for d in devices.split(",") if d.strip()],
                           runtimes=[r.strip() for r in runtimes.split(",") if r.strip()], rate_per_s=rate,
                           input_len=input_len, output_len=output_len, slo=parse_slo(slo), max_gpus=max_gpus,
                           dtype=dtype, quant=quant, kv_dtype=kv_dtype, num_requests=num_requests,
                           arrival=arrival, prices=_prices(price, price_file), tp=_ints(tp, "--tp") if tp else None,
                           enable_expert_parallel=expert_parallel, power_limit_w=power_limit,
                           gpu_clock_mhz=gpu_clock, electricity_usd_per_kwh=electricity, pue=pue,
                           grid_g_co2_per_kwh=grid)
        if as_json:
            return plan_serve(req)
        from rich.console import Console

        with Console(stderr=True).status("searching") as status:
            return plan_serve(req, progress=lambda what: status.update(f"searching: {what}"))

    _output_path(csv_out, "--csv")
    _output_path(plot, "--plot")
    result, _ = _run(go)
    if not _given(ctx, "runtimes"):
        result = result.model_copy(update={"assumptions": [DEFAULT_ENGINE_NOTE, *result.assumptions]})
    if csv_out:
        _write_or_fail(csv_out, report.write_plan_csv, result, csv_out)
    if plot:
        from .plots import pareto_png
        _run(pareto_png, result, plot)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        report.print_plan(result)
    _exit_if(not result.ranked)


@plan_app.command("train")
def plan_train_cmd(
    model: str = typer.Option(..., "--model", "-m"),
    tokens: float = typer.Option(..., "--tokens", help="tokens to train on, e.g. 1e12"),
    seq: int = typer.Option(4096, "--seq", help="sequence length"),
    global_batch: int = typer.Option(1024, "--global-batch", help="sequences per optimizer step"),
    devices: str = typer.Option("h100,a100", help="comma-separated GPUs or multi-node systems"),
    gpus: str = typer.Option("64,256,1024", help="comma-separated GPU counts (whole nodes beyond one node)"),
    tp: str = typer.Option("1,2,4,8", help="tensor parallel degrees to try"),
    pp: str = typer.Option("1,2,4,8", help="pipeline parallel degrees to try"),
    zero: str = typer.Option("0,1,2,3", help="ZeRO stages to try"),
    recompute: str = typer.Option("none,full", help="activation checkpointing modes to try"),
    micro_batch: str = typer.Option("1,2,4", "--micro-batch", help="micro-batch sizes to try"),
    ep: Optional[str] = typer.Option(None, "--ep", help="MoE expert parallel degrees to try (experts spread over "
                                     "ep of the tp x dp GPUs; default 1 and each of 8, 64 dividing the experts)"),
    precision: str = typer.Option("bf16-mixed", help="bf16-mixed | 16-mixed | bf16-true | 16-true | 32-true"),
    price: list[str] = typer.Option([], "--price", help="GPU=USD per GPU-hour (repeatable)"),
    price_file: Optional[Path] = typer.Option(None, "--price-file", help="YAML/JSON mapping GPU -> USD per GPU-hour"),
    electricity: float = typer.Option(0.10, "--electricity-usd-per-kwh"),
    pue: float = typer.Option(1.2, "--pue", help="power usage effectiveness of the data center (kWh/day x PUE)"),
    top: int = typer.Option(15, "--top", help="rows of the ranked table to print (at least the fastest plan of "
                            "every device and GPU count)"),
    csv_out: Optional[Path] = typer.Option(None, "--csv", help="write every costed plan that fits as CSV (a heavier "
                                           "recompute is not costed where a lighter one fits at that micro-batch)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write time to train vs $ as png, pdf, svg or jpg "
                                        "(needs matplotlib)"),
    as_json: bool = typer.Option(False, "--json"),
):
    """The fastest training plans (TP x PP x DP x EP x ZeRO x recompute x micro-batch) per device and GPU count."""
    from .studies.plan_train import COLUMNS, plan_train, plan_train_request, table_rows

    def go():
        req = plan_train_request(model=model, tokens=tokens, seq=seq, global_batch=global_batch,
                                 devices=[d.strip() for d in devices.split(",") if d.strip()],
                                 gpus=_ints(gpus, "--gpus"), tp=_ints(tp, "--tp"), pp=_ints(pp, "--pp"),
                                 zero=[int(z) for z in zero.split(",") if z.strip().isdigit()], recompute=[r.strip() for r in recompute.split(",")],
                                 micro_batch=_ints(micro_batch, "--micro-batch"),
                                 ep=_ints(ep, "--ep") if ep is not None else None, precision=precision,
                                 prices=_prices(price, price_file), electricity_usd_per_kwh=electricity, pue=pue)
        return plan_train(req, progress=None if as_json else lambda m: typer.echo(m, err=True))

    _output_path(csv_out, "--csv")
    _output_path(plot, "--plot")
    result, _ = _run(go)
    if csv_out:
        _write_or_fail(csv_out, _write_rows, csv_out, [COLUMNS, *table_rows(result.ranked)])
    if plot:
        from .plots import train_plan_png
        _run(train_plan_png, result, plot)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        from .report import print_train_plan

        print_train_plan(result, top)
    _exit_if(not result.ranked)


@app.command("list")
def list_(what: str = typer.Argument(..., help="models|devices|runtimes (gpus: devices)")):
    """List shipped models, devices (GPUs and systems) or runtimes."""
    from . import report

    what = {"gpus": "devices", "engines": "runtimes"}.get(what, what)
    if what not in ("models", "devices", "runtimes"):
        _fail(f"unknown list {what!r}; choose models, devices or runtimes")
    report.print_list(what)


@app.command()
def validate(
    suite: Optional[Path] = typer.Argument(None, help="suite YAML to measure on the local GPU(s)"),
    out: Optional[Path] = typer.Option(None, help="measured JSONL (appended; finished cases are skipped)"),
    reference: Optional[str] = typer.Option(None, help="compare with a published or measured reference: torchcap|cs336|"
                                            "tgi-bloomz|whisper-cpp|trtllm-perf|vllm-serve|serve-cb"),
    report_from: Optional[list[Path]] = typer.Option(None, "--report", help="measured JSONL file(s) to report on"),
    fmt: str = typer.Option("rst", "--format", help="rst|markdown|csv|json"),
    max_minutes: Optional[float] = typer.Option(None, help="stop the suite cleanly after this many minutes"),
    accuracy_doc: Optional[Path] = typer.Option(None, help="regenerate docs/accuracy.md (all datasets + references)"),
    device_name: Optional[str] = typer.Option(None, help="GPU name to record; 'cpu' measures on the CPU on purpose "
                                              "(without CUDA a suite is refused otherwise)"),
):
    """Measure a suite on the local GPU(s), or report estimated vs measured for measured or published data."""
    if fmt not in ("rst", "markdown", "csv", "json"):
        _fail(f"--format is one of rst, markdown, csv, json (got {fmt!r})")
    try:
        if accuracy_doc:
            from .validation.accuracy import build
            build(accuracy_doc)
            typer.echo(f"wrote {accuracy_doc}")
        elif reference == "serve-cb":
            from .validation.serve_report import serve_section
            typer.echo("\n".join(serve_section()))
        elif reference:
            from .validation.published import compare_reference
            typer.echo(compare_reference(reference, fmt=fmt))
        elif report_from:
            from .validation.report import build_report
            typer.echo(build_report([str(p) for p in report_from], fmt=fmt))
        elif suite:
            from .validation.runner import run_suite
            if out is None:
                _fail("give --out FILE.jsonl for the measured results")
            run_suite(str(suite), str(out), max_minutes=max_minutes, device_name=device_name)
        else:
            _fail("give a suite file, --report FILE.jsonl or --reference NAME")
    except (AisimError, ValueError, OSError) as exc:
        _fail(str(exc))


@app.command()
def calibrate(
    device: str = typer.Option(..., "--device", help="aisim device name of the local GPU (h100-sxm, h200, ...)"),
    out: Optional[Path] = typer.Option(None, help="calibration YAML (default: DEVICE.yaml in the user spec directory's "
                                       "calibration/, $AISIM_SPECS_DIR or ~/.config/aisim/specs, where estimates "
                                       "read it first)"),
    quick: bool = typer.Option(False, help="small grids (about a minute)"),
    max_minutes: float = typer.Option(4.0, help="time budget"),
    host_only: bool = typer.Option(False, "--host-only", help="only this machine's eager CPU costs (dispatch loops, "
                                   "tiny HF models; about 15 s): a host YAML for --host"),
):
    """Run microbenchmarks on the local GPU and write its calibration file."""
    try:
        from .validation.calibrate import default_output, run_calibration
        if host_only:
            from .validation.host import write_host_file
            typer.echo(f"wrote {write_host_file(out or default_output(device).with_suffix('.host.yaml'))}")
            return
        target = out or default_output(device)
        path = run_calibration(device, target, quick=quick, max_minutes=max_minutes)
        typer.echo(f"wrote {path}")
    except (AisimError, RuntimeError, ValueError, OSError) as exc:
        _fail(str(exc))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
