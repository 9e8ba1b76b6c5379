"""The per-op host table of a calibration file, from the op_host microbenchmark (validation/harness/op_host.py; H100:
validation/data/kernels/op-host-h100.jsonl), and the framework and phase scales refitted with it.

    python -m aisim.validation.scripts.derive_op_host [--calibration h100-sxm] [--write]

- ``eager_op_host_ratio``: per aten op aisim traces, the median over the file's runs of its microbenchmark's host
  cost per call relative to a plain torch.add timed in the same interleaved loop (OPS maps them; aten.clone is
  t().contiguous() less the transpose; 'view' is the median of the view ops, 'kernel' 1). Tiny non-judged bf16
  shapes: a property of PyTorch's dispatcher and the CUDA launch path, taken as portable across hosts (as
  eager_phase_scale); the same table goes to default.yaml, from which a new calibration copies it.
- ``--extra`` (printed only): the ops DATA lacks (LayerNorm, the MoE routing ops, in-place ops...), timed by the same
  harness on an H200 host (EXTRA), and the scales refitted with them; docs/calibration.md gives what it changes.
- ``eager_add_dispatch_s``: the calibration's own measured plain add (its raw file's add_out_s median).
- ``eager_framework_scale``: the raw file's tiny-model forwards (framework records) over what the per-op costs
  predict for their traced steps (framework_overhead.fit_framework_scale_per_op).
- ``eager_step_host_adds`` (only with --step-adds; the shipped files do not set it, see
  validation/scripts/step_host_whatif.py): HF's per-call host work outside the ops, in plain adds: the intercept
  over depth of tiny non-judged models at 1-16 layers (validation/data/kernels/framework-depth-h100*.jsonl,
  framework_overhead.fit_step_host_adds), fitted first; the scales below are then fitted with it.
- ``eager_phase_scale``: train, the same with the per-op costs (h100-sxm's: the rounds ran on an H100 host) from
  the four rounds of validation/data/kernels/framework-phases-h100.jsonl (median over rounds; decode brackets 1 and
  stays unset); one value, written to default.yaml too (a new calibration copies it).

Nothing here sees a judged row. --write replaces those lines of the calibration file (and default.yaml's table).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from . import calibration_name, run_main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data" / "kernels" / "op-host-h100.jsonl"
# the same harness with the ops it lacked, two runs on an H200 host (2026-11-28): read for the ops DATA has no
# record of with --extra (printed only: the shipped files do not use it, docs/calibration.md says why); its runs'
# ratios for the ops both files time agree with DATA's (portable_check)
EXTRA = tuple(ROOT / "validation" / "data" / "kernels" / f"op-host-extra-h200{s}.jsonl" for s in ("", "-run2"))
PHASES = ROOT / "validation" / "data" / "kernels" / "framework-phases-h100.jsonl"
DEPTHS = tuple(ROOT / "validation" / "data" / "kernels" / f"framework-depth-h100{s}.jsonl" for s in ("", "-run2"))
CAL_DIR = ROOT / "hardware_specs" / "calibration"
# aisim's traced aten op -> the op_host microbenchmark that times it
OPS = {"aten.add.Tensor": "add", "aten.mul.Tensor": "mul", "aten.neg": "neg", "aten.rsqrt": "rsqrt",
       "aten.pow.Tensor_Scalar": "pow", "aten.mean.dim": "mean", "aten.sum.dim_IntList": "sum", "aten.silu": "silu",
       "aten.sigmoid": "sigmoid", "aten._softmax": "softmax", "aten._to_copy": "to_fp32", "aten.cat": "cat",
       "aten.masked_fill.Scalar": "masked_fill", "aten.index.Tensor": "index", "aten.index_select": "index_select",
       "aten.embedding": "embedding", "aten.mm": "mm", "aten.addmm": "addmm", "aten.bmm": "bmm", "aten.topk": "topk",
       "attention.flash": "sdpa_decode", "attention.efficient": "sdpa_decode", "attention.cudnn": "sdpa_decode",
       "aten.view": "view", "aten._unsafe_view": "view", "aten.t": "transpose", "aten.transpose.int": "transpose",
       "aten.permute": "transpose", "aten.unsqueeze": "unsqueeze", "aten.squeeze.dim": "unsqueeze",
       "aten.slice.Tensor": "slice", "aten.select.int": "slice", "aten.expand": "expand",
       # EXTRA's: LayerNorm models, the MoE routing of transformers' grouped_mm experts, gpt-oss / DeepSeek extras;
       # comparisons and fills share their family's timing (one of each is timed)
       "aten.native_layer_norm": "layer_norm", "aten.relu": "relu", "aten.tanh": "tanh", "aten.gelu": "gelu",
       "aten.sub.Tensor": "sub", "aten.div_.Tensor": "div_", "aten.add_.Tensor": "add_", "aten.copy_": "copy_",
       "aten.clamp": "clamp", "aten.clamp_": "clamp_", "aten.masked_fill_.Scalar": "masked_fill_",
       "aten.where.self": "where", "aten.max.dim": "max_dim", "aten.arange": "arange", "aten.zeros": "zeros",
       "aten.ones": "zeros", "aten.new_ones": "zeros", "aten.ones_like": "zeros", "aten.floor_divide": "floor_divide",
       "aten.ge.Scalar": "ge_scalar", "aten.eq.Scalar": "ge_scalar", "aten.ne.Scalar": "ge_scalar",
       "aten.gt.Tensor": "gt_tensor", "aten.le.Tensor": "gt_tensor", "aten.bitwise_and.Tensor": "bitwise_and",
       "aten.index_put_": "index_put_", "aten.cos": "cos", "aten.sin": "cos", "aten.empty_like": "empty_like",
       "aten.split.Tensor": "split", "aten.split_with_sizes": "split", "aten.detach": "detach",
       "aten.alias": "detach"}
VIEWS = ("view", "transpose", "unsqueeze", "slice", "expand")


def op_ratios(path: Path = DATA) -> dict[str, float]:
    """Microbenchmark name -> median ratio to the add over the file's runs."""
    found: dict[str, list[float]] = {}
    with open(path) as f:
        for r in map(json.loads, f):
            if r.get("type") == "op" and r.get("status") == "ok" and r.get("ratio_to_add"):
                found.setdefault(r["name"], []).append(r["ratio_to_add"])
    return {k: statistics.median(v) for k, v in found.items()}


def extra_ratios(paths: tuple[Path, ...] = EXTRA) -> dict[str, float]:
    """Microbenchmark name -> median ratio to the add over EXTRA's runs pooled."""
    found: dict[str, list[float]] = {}
    for path in paths:
        with open(path) as f:
            for r in map(json.loads, f):
                if r.get("type") == "op" and r.get("status") == "ok" and r.get("ratio_to_add"):
                    found.setdefault(r["name"], []).append(r["ratio_to_add"])
    return {k: statistics.median(v) for k, v in found.items()}


def portable_check(path: Path = DATA, extra: tuple[Path, ...] = EXTRA) -> dict[str, tuple[float, float]]:
    """The ops both files time: name -> (DATA's ratio, EXTRA's): the table's portability across hosts."""
    a, b = op_ratios(path), extra_ratios(extra)
    return {k: (a[k], b[k]) for k in a if k in b and k != "add"}


def host_table(path: Path = DATA, extra: tuple[Path, ...] | None = None) -> dict[str, float]:
    """eager_op_host_ratio: aten op -> ratio, with 'kernel' and 'view' defaults; ops ``path`` does not time from
    ``extra``."""
    med = {**(extra_ratios(extra) if extra else {}), **op_ratios(path)}
    table = {aten: round(med[name], 3) for aten, name in OPS.items() if name in med}
    table["aten.clone"] = round(med["t_contiguous"] - med["transpose"], 3)
    table["kernel"] = 1.0
    table["view"] = round(statistics.median(med[v] for v in VIEWS), 3)
    return dict(sorted(table.items()))


def step_host_adds(table: dict[str, float] | None = None) -> dict[str, float]:
    """eager_step_host_adds from the depth sweeps (DEPTHS), read with h100-sxm's constants (they ran on H100
    hosts; a ratio to the plain add, portable as the table is)."""
    from aisim.validation.framework_overhead import fit_step_host_adds

    h100, _ = _with_table("h100-sxm", table or host_table())
    runs = []
    for depth in DEPTHS:
        with open(depth) as f:
            runs.append([r for r in map(json.loads, f) if r.get("type") == "record"])
    fit = fit_step_host_adds(runs, h100)
    if "forward" not in fit:
        raise ValueError(f"no depth sweep of three or more depths in {', '.join(map(str, DEPTHS))}")
    return fit


def derive(calibration: str, path: Path = DATA, with_step_adds: bool = False, with_extra: bool = False) -> dict:
    from aisim.validation.framework_overhead import fit_framework_scale_per_op, fit_phase_scales_per_op

    table = host_table(path, EXTRA if with_extra else None)
    cal, raw = _with_table(calibration, table)
    # the phase rounds ran on an H100 host: their ratios are read with its constants, one value for every file
    # (a ratio of host costs, portable as the table is; default.yaml carries it for new calibrations)
    h100, _ = _with_table("h100-sxm", table)
    step_adds = step_host_adds(table) if with_step_adds else {}
    cal = cal.model_copy(update={"eager_step_host_adds": step_adds})
    h100 = h100.model_copy(update={"eager_step_host_adds": step_adds})
    scale = fit_framework_scale_per_op(raw, cal)
    rounds: dict[int, list[dict]] = {}
    with open(PHASES) as f:
        for r in map(json.loads, f):
            if r.get("type") == "record" and r.get("bench") == "framework_phase":
                rounds.setdefault(r["round"], []).append(r)
    per_round = [fit_phase_scales_per_op(recs, h100) for recs in rounds.values()]
    train = [p["train"] for p in per_round if "train" in p]
    decode = [p["decode"] for p in per_round if "decode" in p]
    return {"eager_add_dispatch_s": float(f"{cal.eager_add_dispatch_s:.4g}"), "eager_op_host_ratio": table,
            **({"eager_step_host_adds": step_adds} if step_adds else {}), "eager_framework_scale": round(scale, 4),
            "eager_phase_scale": {"train": round(statistics.median(train), 3)},
            "train_per_round": train, "decode_per_round": decode}


def _with_table(calibration: str, table: dict[str, float]):
    """(the calibration with the table and its own measured add, its raw records)."""
    from aisim.specs import load_calibration

    raw = json.loads((CAL_DIR / f"{calibration}.raw.json").read_text())["records"]
    add_s = statistics.median(next(r for r in raw if r.get("name") == "add_out_s")["samples_s"])
    cal = load_calibration(calibration).model_copy(update={"eager_add_dispatch_s": add_s, "eager_op_host_ratio": table})
    return cal, raw


def _flow(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def write(calibration: str, fit: dict) -> None:
    path = CAL_DIR / f"{calibration}.yaml"
    text = path.read_text()
    lines = {"eager_add_dispatch_s": f"eager_add_dispatch_s: {fit['eager_add_dispatch_s']}",
             "eager_op_host_ratio": f"eager_op_host_ratio: {_flow(fit['eager_op_host_ratio'])}",
             "eager_framework_scale": f"eager_framework_scale: {fit['eager_framework_scale']}",
             "eager_phase_scale": f"eager_phase_scale: {_flow(fit['eager_phase_scale'])}"}
    note = ("# eager_add_dispatch_s, eager_op_host_ratio, eager_framework_scale, eager_phase_scale: python -m "
            "aisim.validation.scripts.derive_op_host --calibration " + calibration + " (the per-op host table from "
            "validation/data/kernels/op-host-h100.jsonl, harness/op_host.py on NVIDIA H100 80GB HBM3, driver "
            "580.159.04, torch 2.11.0+cu130, 2026-11-26, two runs; the add from this file's raw records; the scales "
            "refitted with it on the raw file's tiny models and on framework-phases-h100.jsonl's four rounds, train "
            + "-".join(f"{x:.2f}" for x in (min(fit["train_per_round"]), max(fit["train_per_round"])))
            + " per round; decode " + "-".join(f"{x:.2f}" for x in (min(fit["decode_per_round"]),
                                                                  max(fit["decode_per_round"])))
            + ", which brackets 1, so not set).")
    for key, line in lines.items():
        pattern = re.compile(rf"^{key}:.*$", re.M)
        text = pattern.sub(line, text) if pattern.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    pattern = re.compile(r"^# eager_add_dispatch_s, eager_op_host_ratio.*$", re.M)
    text = pattern.sub(note, text) if pattern.search(text) else text.replace(
        lines["eager_add_dispatch_s"], note + "\n" + lines["eager_add_dispatch_s"])
    path.write_text(text)


def write_default_table(fit: dict) -> None:
    """default.yaml: the table (inactive there: no add of its own) and the train phase scale, which a new
    calibration copies."""
    path = CAL_DIR / "default.yaml"
    text = path.read_text()
    line = f"eager_op_host_ratio: {_flow(fit['eager_op_host_ratio'])}"
    pattern = re.compile(r"^eager_op_host_ratio:.*$", re.M)
    text = pattern.sub(line, text) if pattern.search(text) else re.sub(
        r"^eager_phase_scale:", line + "\neager_phase_scale:", text, count=1, flags=re.M)
    text = re.sub(r"^eager_phase_scale:.*$", f"eager_phase_scale: {_flow(fit['eager_phase_scale'])}", text,
                  flags=re.M)
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration", default="h100-sxm", type=calibration_name)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--step-adds", action="store_true",
                        help="also fit eager_step_host_adds from the depth sweeps and the scales with it (printed only)")
    parser.add_argument("--extra", action="store_true",
                        help="also the ops DATA lacks, from the H200 host's runs (EXTRA), and the scales refitted with "
                             "them (printed only)")
    args = parser.parse_args(argv)
    if args.step_adds and args.write:
        parser.error("--step-adds is printed only: the shipped files do not set it "
                     "(validation/scripts/step_host_whatif.py)")
    if args.extra and args.write:
        parser.error("--extra is printed only: the shipped table leaves those ops at one plain add "
                     "(docs/calibration.md, 'The ops the per-op table lacks')")
    for depth in DEPTHS if args.step_adds else ():
        if not depth.is_file():
            parser.error(f"--step-adds: the depth sweep {depth} is not a file")
    raw = CAL_DIR / f"{args.calibration}.raw.json"
    for path, what in ((raw, "--calibration: no raw measurements of that calibration"), (Path(args.data), "--data")):
        if not path.is_file():
            parser.error(f"{what}: {path} is not a file")
    try:
        fit = derive(args.calibration, Path(args.data), args.step_adds, args.extra)
    except (ValueError, KeyError, StopIteration) as exc:   # a file without the records derive needs
        files = f"{args.data}, {raw}" + (" or the depth sweeps" if args.step_adds else "")
        parser.error(f"{files}: not the op_host / calibration / depth records expected ({type(exc).__name__}: "
                     f"{exc})")
    print(json.dumps(fit, indent=1))
    if args.write:
        write(args.calibration, fit)
        write_default_table(fit)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
