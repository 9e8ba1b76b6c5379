"""The calibration entry behind HF's explicit-attention KV-cache concat, and the check of both decode rules against
the eager_attention microbenchmark (validation/harness/eager_attention.py; validation/data/kernels/
eager-attention-h100.jsonl, -h200).

    python -m aisim.validation.scripts.derive_eager_attention [DATA.jsonl ...] [--gpu h100-sxm] [--write]
        [--write-default]

- A batched GEMM below the ridge point is read on the skinny-GEMM rule (cost/efficiency.py
  batched_gemm_memory_efficiency: default.yaml's gemm_memory_efficiency, t = 6.5 us + bytes / (0.88 x datasheet
  bandwidth), fitted to the H100 and H200 raw torch.matmul records with M <= 8). Printed: this GPU's own fit of
  those records (relative-error least squares: hardware_specs/calibration/<gpu>.raw.json); the microbenchmark's bmm
  rows check the rule, nothing is fitted to them.
- ``strided_cat_elements_per_sm_cycle``: the microbenchmark's cat rows with a non-contiguous input (cat_strided at
  every batch, cat_strided_batch from batch 2; inputs of >= 64 MiB): the median of output elements per second over
  (SM count x boost clock). ``--write-default`` writes the mean over the data files given into default.yaml (the
  rule for GPUs without a measured rate).

- ``view_copy_efficiency``: the microbenchmark's crop_contiguous rows (16-bit; a cache cropped by one token, then
  made contiguous: PyTorch's generic elementwise copy out of a view whose head_dim rows stay contiguous), fitted as
  t = t0 + bytes / rate (validation/rewind.py crop_copy_fit), rate over the datasheet bandwidth, from the first data
  file that has those rows (H100: 0.495 of 3.35 TB/s; H200: 0.363 of 4.8 TB/s, the same 1.7 TB/s: not bound by
  bandwidth).

Without --write it prints the values and the check: the bmm rows (16-bit, memory-bound: decode and small
prefills) predicted the old way (a GEMM table read at (batch x M) x N x K) and the new (the skinny-GEMM curve), and
the cat rows predicted on the contiguous memory curve alone (old) and with the strided rate or, contiguous, the
cat curve (new), against the measured times (a CUDA-graph replay: the graph replay credit is taken off each
prediction).

- ``memory_op_efficiency['cat']`` (cat_curve): the contiguous cats' own curve (a KV-cache cat of DynamicCache);
  PyTorch's cat kernel plateaus at 0.85 (H100) and 0.82 (H200) of bandwidth, where a clone reaches 0.90 and 0.89
  and the median of all elementwise kernels (memory_efficiency) 0.89 and 0.80. The contiguous cat rows' "new"
  check column is this curve on the rows it was taken from (a consistency check, not out of sample).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from . import run_main
from .derive_grouped_gemm import load   # (header, ok case rows) of a harness JSONL file

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data" / "kernels"
CAL_DIR = ROOT / "hardware_specs" / "calibration"
SKINNY_MAX_M = 8
CAT_MIN_BYTES = 64 * 2 ** 20


def fit_skinny_gemm(raw: dict) -> tuple[float, float, int]:
    """(t0 seconds, fraction of datasheet bandwidth, records) of t = t0 + bytes / (p x BW) over the raw file's
    16-bit matmul records with M <= 8 (relative-error least squares)."""
    from aisim.validation.calibrate_fit import ELEM_BYTES, fit_fixed_plus_linear, gemm_bytes

    bw = raw["peaks"]["memory_bw_bytes_per_s"]
    rows = [r for r in raw["records"] if r["bench"] == "gemm" and r.get("time_s") and r["m"] <= SKINNY_MAX_M
            and r["dtype"] in ("fp16", "bf16")]
    t0, per_byte = fit_fixed_plus_linear([r["time_s"] for r in rows],
                                         [gemm_bytes(r["m"], r["n"], r["k"], ELEM_BYTES[r["dtype"]]) for r in rows])
    return t0, 1.0 / (per_byte * bw), len(rows)


def strided_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("section") == "cat" and r["bytes"] >= CAT_MIN_BYTES
            and (r["op"] == "cat_strided" or (r["op"] == "cat_strided_batch" and r["batch"] > 1))]


def cat_elements(r: dict) -> int:
    return r["batch"] * r["heads"] * (r["s"] + 1) * r["d"]


def strided_rate(rows: list[dict], gpu) -> tuple[float, int]:
    """(output elements per SM per cycle, rows) of the non-contiguous cats."""
    picked = strided_rows(rows)
    per_s = [cat_elements(r) / (r["median_ms"] * 1e-3) for r in picked]
    return statistics.median(per_s) / (gpu.sm_count * gpu.boost_clock_mhz * 1e6), len(picked)


def check(rows: list[dict], gpu, cal, rate: float) -> dict[str, tuple[float, float, int]]:
    """MAPE (%) old / new per group of rows (bmm 16-bit memory-bound; strided and contiguous cats)."""
    from aisim.cost import efficiency

    cal = cal.model_copy(update={"strided_cat_elements_per_sm_cycle": rate})
    credit, bw = efficiency.graph_replay_credit_s(cal, gpu), gpu.memory_bw_bytes_per_s
    errors: dict[str, tuple[list, list]] = {}
    for r in rows:
        measured = r["median_ms"] * 1e-3
        if r.get("section") == "cat":
            if r["op"] not in ("cat_contig", "cat_strided", "cat_strided_batch"):
                continue           # crop_contiguous: the harnesses' rewind copy (validation/rewind.py)
            roof = r["bytes"] / bw
            old = roof / efficiency.memory_efficiency(cal, r["bytes"], gpu)
            # as op_time prices a cat: its own curve where the calibration has one, the strided kernel's rate as
            # a floor when an input is not contiguous
            cat = roof / efficiency.memory_efficiency(cal, r["bytes"], gpu,
                                                      family=efficiency.MEMORY_OP_FAMILY["aten.cat"])
            contiguous = contiguous_cat(r)
            new = cat if contiguous else max(cat, efficiency.strided_cat_s(cal, gpu, cat_elements(r)))
            group = "cat, contiguous inputs" if contiguous else "cat, a strided input"
        else:
            if r["dtype"] not in ("fp16", "bf16"):
                continue
            roof_c, roof_m = r["flop"] / gpu.peak_for(r["dtype"]), r["bytes"] / bw
            if roof_m <= roof_c:
                continue
            n, k = (r["s"], r["d"]) if r["op"].startswith("qk") else (r["d"], r["s"])
            table = cal.gemm_tables.get(r["dtype"])
            old = roof_m / (efficiency.gemm_table_value(table, r["bh"] * r["m"], n, k) if table is not None else
                            efficiency.gemm_efficiency(cal, r["dtype"], r["bh"] * r["m"], n, k, r["flop"], r["bytes"],
                                                       True, gpu))
            new = roof_m / efficiency.batched_gemm_memory_efficiency(cal, r["bytes"], gpu)
            group = f"bmm {r['phase']}, 16-bit, memory-bound"
        old, new = (max(t - credit, 0.25 * t) for t in (old, new))
        pair = errors.setdefault(group, ([], []))
        pair[0].append(abs(old / measured - 1))
        pair[1].append(abs(new / measured - 1))
    return {g: (100 * statistics.mean(o), 100 * statistics.mean(n), len(o)) for g, (o, n) in errors.items()}


def view_copy_efficiency(rows: list[dict], gpu) -> float | None:
    """The crop_contiguous rows' copy rate over ``gpu``'s datasheet bandwidth (None without such rows)."""
    from aisim.validation.rewind import crop_copy_fit

    fit = crop_copy_fit(rows)
    return None if fit is None else fit[1] / gpu.memory_bw_bytes_per_s


def cat_curve(rows: list[dict], gpu, cal):
    """The contiguous cats' curve (``memory_op_efficiency['cat']``): per size group (0.1 decade of bytes moved) the
    median bytes / bandwidth / (graph-replay time + the calibration's graph replay credit), the eager
    back-to-back time the memory curves are measured as; below the smallest measured size, the calibration's memory
    curve (tiny cats are launch-bound); None without contiguous cat rows."""
    import math

    from aisim.cost import efficiency
    from aisim.specs import Curve

    credit, bw = efficiency.graph_replay_credit_s(cal, gpu), gpu.memory_bw_bytes_per_s
    groups: dict[float, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("section") == "cat" and contiguous_cat(r):
            x = math.log10(r["bytes"])
            groups.setdefault(round(x, 1), []).append((x, r["bytes"] / bw / (r["median_ms"] * 1e-3 + credit)))
    if not groups:
        return None
    xs = [round(statistics.median(p[0] for p in groups[k]), 4) for k in sorted(groups)]
    effs = [round(statistics.median(p[1] for p in groups[k]), 4) for k in sorted(groups)]
    median = cal.memory_efficiency
    below = [(x, e) for x, e in zip(median.x, median.efficiency) if x < xs[0] - 0.05]
    return Curve(x=[x for x, _ in below] + xs, efficiency=[e for _, e in below] + effs)


def contiguous_cat(r: dict) -> bool:
    """A cat row whose inputs are all contiguous (PyTorch's vectorized cat kernel)."""
    return r["op"] == "cat_contig" or (r["op"] == "cat_strided_batch" and r["batch"] == 1)


def write_lines(path: Path, lines: dict[str, str], note: str) -> None:
    """Replace each ``key: ...`` line (or append it) and the note line above them (a comment starting with the
    first key)."""
    text = path.read_text()
    for key, line in lines.items():
        pattern = re.compile(rf"^{key}:.*$", re.M)
        text = pattern.sub(line, text) if pattern.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    text = re.sub(rf"^# {re.escape(next(iter(lines)))}.*\n", "", text, flags=re.M)
    first = next(iter(lines.values()))
    path.write_text(re.sub(rf"^{re.escape(first)}$", lambda _: note + "\n" + first, text, count=1, flags=re.M))


def _source(path: Path, header: dict) -> str:
    try:
        shown = path.resolve().relative_to(ROOT)
    except ValueError:
        shown = path
    return (f"{shown} ({header.get('gpu_name')}, driver {header.get('driver')}, torch {header.get('torch')}, "
            f"{str(header.get('date', ''))[:10]})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="*", help="harness files, the first of --gpu (default: the GPU's committed "
                        "run, validation/data/kernels/eager-attention-<h100|h200>.jsonl)")
    parser.add_argument("--gpu", default="h100-sxm", help="the GPU of the first data file and of the calibration")
    parser.add_argument("--write", action="store_true", help="update hardware_specs/calibration/<gpu>.yaml")
    parser.add_argument("--write-default", action="store_true",
                        help="write the mean strided-cat rate of the data files into default.yaml")
    args = parser.parse_args(argv)
    from aisim.catalog import resolve_gpu
    from aisim.specs import load_calibration

    if not args.data:
        default = DATA / f"eager-attention-{args.gpu.split('-')[0]}.jsonl"
        if not default.is_file():
            raise SystemExit(f"no committed eager_attention run for {args.gpu}: give the harness file(s) to read")
        args.data = [str(default)]
    rates, sources, loaded = [], [], {}
    for i, name in enumerate(args.data):
        header, rows = loaded[name] = load(Path(name))
        gpu = resolve_gpu(header.get("gpu_name", "")) if i else resolve_gpu(args.gpu)
        rate, n = strided_rate(rows, gpu)
        rates.append(rate)
        sources.append(_source(Path(name), header))
        print(f"{name}: {header.get('gpu_name')}: strided cat {rate:.4f} output elements per SM-cycle "
              f"({n} rows of >= 64 MiB)")
    header, rows = loaded[args.data[0]]
    gpu = resolve_gpu(args.gpu)
    # the view-copy rate from the first file that has crop_contiguous rows (all of --gpu's GPU)
    view_copy, view_source = None, None
    for name in args.data:
        found = view_copy_efficiency(loaded[name][1], gpu)
        if found is not None:
            view_copy, view_source = found, name
            print(f"{name}: copy out of a cropped cache view (crop_contiguous): {view_copy:.3f} of datasheet "
                  "bandwidth")
            break
    raw_path = CAL_DIR / f"{args.gpu}.raw.json"
    if raw_path.is_file():
        t0, fraction, n = fit_skinny_gemm(json.loads(raw_path.read_text()))
        print(f"{raw_path.name}: skinny GEMMs (M <= {SKINNY_MAX_M}, 16-bit, {n} records): t0 {t0 * 1e6:.2f} us, "
              f"{fraction:.3f} of datasheet bandwidth (the rule: 6.5 us, 0.88)")
    for group, (old, new, count) in check(rows, gpu, load_calibration(args.gpu), rates[0]).items():
        print(f"{group:38s} {count:4d} rows: MAPE old {old:6.1f}%  new {new:6.1f}%")
    if args.write:
        note = (f"# strided_cat_elements_per_sm_cycle: python -m aisim.validation.scripts.derive_eager_attention "
                f"{Path(args.data[0]).name} --gpu {args.gpu} --write (from {sources[0]})")
        write_lines(CAL_DIR / f"{args.gpu}.yaml",
                    {"strided_cat_elements_per_sm_cycle": f"strided_cat_elements_per_sm_cycle: {rates[0]:.4f}"}, note)
        if view_copy is not None:
            source = sources[args.data.index(view_source)]
            write_lines(CAL_DIR / f"{args.gpu}.yaml",
                        {"view_copy_efficiency": f"view_copy_efficiency: {view_copy:.3f}"},
                        f"# view_copy_efficiency: python -m aisim.validation.scripts.derive_eager_attention "
                        f"{' '.join(Path(n).name for n in args.data)} --gpu {args.gpu} --write (the crop_contiguous "
                        f"rows of {source})")
        curve = cat_curve(rows, gpu, load_calibration(args.gpu))
        if curve is not None:
            write_lines(CAL_DIR / f"{args.gpu}.yaml", {"memory_op_efficiency": "memory_op_efficiency: {cat: {x: "
                                                       f"{curve.x}, efficiency: {curve.efficiency}}}}}"},
                        f"# memory_op_efficiency: python -m aisim.validation.scripts.derive_eager_attention "
                        f"{Path(args.data[0]).name} --gpu {args.gpu} --write (cat: the contiguous cats of "
                        f"{sources[0]}, CUDA-graph replays plus the calibration's graph replay credit; below their "
                        "smallest size the memory curve)")
        print(f"wrote {args.gpu}.yaml")
    if args.write_default:
        mean = statistics.mean(rates)
        note = ("# strided_cat_elements_per_sm_cycle: python -m aisim.validation.scripts.derive_eager_attention "
                "--write-default (the mean of " + ", ".join(f"{r:.3f}" for r in rates) + " measured on "
                + "; ".join(sources) + ": the same rate on two GPUs of one SM count and clock and 1.43x different "
                "bandwidth, so not bandwidth-bound; read per SM-cycle on other GPUs, an assumption: no GPU of "
                "another SM count or clock was measured)")
        write_lines(CAL_DIR / "default.yaml",
                    {"strided_cat_elements_per_sm_cycle": f"strided_cat_elements_per_sm_cycle: {mean:.4f}"}, note)
        print("wrote default.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
