"""Write the three notebooks (nbformat) and execute them in place with nbclient: python notebooks/build.py [NAME]."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent
md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell

SERVING = [
    md("# Serving capacity: Llama-3-8B and Llama-3-70B across GPUs\n\nThe cheapest configuration per GPU that "
       "meets the SLOs at several loads (`aisim.studies.plan_serve`), the Pareto front of throughput per GPU vs "
       "speed per user, and one configuration simulated request by request (`run_serve`), all under the `vllm` "
       "engine profile (vLLM V1's scheduler defaults, memory policy and kernels: hardware_specs/runtimes/vllm.yaml; "
       "`runtimes=['vllm', 'transformers-cb']` compares engines). Few requests per simulation keep this notebook "
       "near a minute on a CPU; raise `num_requests` for tighter percentiles."),
    code("import pandas as pd\n" if False else "from IPython.display import Image\n"
         "from aisim.studies.plan_serve import plan_request, plan_serve\n"
         "from aisim import plots\n"
         "SLO = {'p90_ttft_ms': 2000.0, 'median_tpot_ms': 150.0}"),
    code("rows = []\nresults = {}\n"
         "for model, devices, max_gpus in [('llama-3-8b', ['h100', 'a100', 'l4'], 8), ('llama-3-70b', ['h100', 'a100'], 8)]:\n"
         "    for rate in (1.0, 4.0):\n"
         "        r = plan_serve(plan_request(model=model, devices=devices, runtimes=['vllm'], rate_per_s=rate,\n"
         "                                    input_len='512', output_len='128', num_requests=20,\n"
         "                                    max_gpus=max_gpus, max_num_seqs=[None], slo=SLO))\n"
         "        results[(model, rate)] = r\n"
         "        for d, c in r.cheapest_per_device.items():\n"
         "            rows.append((model, rate, f'{d} ({c.runtime})', c.tp, c.replicas, c.gpus, round(c.usd_per_hour, 2),\n"
         "                         round(c.usd_per_million_output_tokens, 2), round(c.joules_per_output_token, 2),\n"
         "                         round(c.kwh_per_day, 1)))\n"
         "for r in results.values():\n    for k, why in r.not_feasible.items():\n"
         "        print(f'{r.model} at {r.rate_per_s:g} req/s, {k}: {why}')\n"
         "print(f\"{'model':12} {'req/s':>5} {'device (engine)':23} tp rep GPUs  $/h  $/Mtok  J/tok kWh/day\")\n"
         "for r in rows:\n"
         "    print(f'{r[0]:12} {r[1]:5.1f} {r[2]:23} {r[3]:2} {r[4]:3} {r[5]:4} {r[6]:5} {r[7]:7} {r[8]:6} {r[9]:7}')"),
    md("More load needs at least as many GPUs; the cost per million tokens falls as the replicas fill up, and stays "
       "where more load takes proportionally more replicas. A deployment serves its offered load (rate x output "
       "tokens per request), so $/M and kWh/day are the steady state's, not the finite simulation's with its drain."),
    md("The Pareto front: at a light load one replica on one GPU is both the cheapest and the fastest per user "
       "(its batch stays small), so the trade-off shows only near saturation. At 40 req/s each candidate (tp x "
       "replicas) either packs the load onto few GPUs (more tokens/s per GPU, larger batches, slower per user) or "
       "spreads it (faster per user, fewer tokens/s per GPU)."),
    code("r = plan_serve(plan_request(model='llama-3-8b', devices=['h100', 'a100'], runtimes=['vllm'], rate_per_s=40.0,\n"
         "                            input_len='512', output_len='128', num_requests=120, max_gpus=8,\n"
         "                            max_num_seqs=[None], slo=SLO))\n"
         "plots.pareto_png(r, 'pareto-llama-3-8b.png')\n"
         "Image('pareto-llama-3-8b.png')"),
    md("## One configuration, request by request"),
    code("from aisim.studies.serve.cli_run import run_serve\n"
         "report, run, notes = run_serve(model='llama-3-8b', device='h100', dtype='bf16', tp=1, pp=1, quant='none',\n"
         "    runtime='vllm', calibration='auto', num_requests=30, input_len='512', output_len='128',\n"
         "    rate=4.0, arrival='poisson', seed=0, trace=None, replicas=None, router='round-robin',\n"
         "    percentiles='50,90,99', knobs={})\n"
         "{k: round(v, 2) for k, v in report.metrics.items() if k in ('output_throughput', 'median_ttft_ms',\n"
         "    'p90_ttft_ms', 'median_tpot_ms', 'energy_j_per_output_token')}"),
]

TRAINING = [
    md("# A training plan: Llama-2-70B on 2T tokens, 256 to 1024 GPUs\n\n`aisim.studies.plan_train` searches "
       "TP x PP x DP x ZeRO stage x recompute x micro-batch on H100 (h100x8-ndr nodes) and A100 (a100x8-hdr "
       "nodes) and ranks the plans that fit by time to train, with MFU, memory per GPU, $ and MWh. The space "
       "below (tp 1/4/8, pp 1/2/4, ZeRO 1/3, micro-batch 1/2/4) keeps this to seconds on a CPU and holds the "
       "best plans of the CLI's wider default search (`aisim plan train --model llama-2-70b --tokens 2e12 --seq "
       "4096 --global-batch 1024 --devices h100,a100 --gpus 256,512,1024`: the same plan per GPU count at 256). "
       "Full recompute is costed only where no recompute does not fit (it adds a forward and only saves memory)."),
    code("from IPython.display import Image\nfrom aisim import plots\n"
         "from aisim.studies.plan_train import plan_train, plan_train_request\n"
         "req = plan_train_request(model='llama-2-70b', tokens=2e12, seq=4096, global_batch=1024,\n"
         "                         devices=['h100', 'a100'], gpus=[256, 512, 1024], tp=[1, 4, 8], pp=[1, 2, 4],\n"
         "                         zero=[1, 3], recompute=['none', 'full'], micro_batch=[1, 2, 4])\n"
         "r = plan_train(req)\n"
         "print(r.considered, 'candidates;', r.pruned, 'pruned;', r.evaluated, 'costed;', r.traces, 'traces')"),
    code("print(f\"{'device':14} GPUs tp pp   dp ZeRO recompute mb  MFU  days GB/GPU          $  MWh\")\n"
         "for c in r.best_per_gpus:\n"
         "    print(f'{c.device:14} {c.gpus:4} {c.tp:2} {c.pp:2} {c.dp:4} {c.zero:4} {c.recompute:>9} {c.micro_batch:2}'\n"
         "          f' {c.mfu:4.0%} {c.time_to_train_days:5.1f} {c.memory_per_gpu_gb:6.1f} {c.usd:10,.0f} {c.energy_mwh:4.0f}')"),
    code("plots.train_plan_png(r, 'train-plan-llama-2-70b.png')\nImage('train-plan-llama-2-70b.png')"),
]

ACCURACY = [
    md("# Accuracy: estimated vs measured\n\nEvery committed measured dataset against the estimate: single-GPU "
       "steps on H100 and H200, tensor parallel on 2 and 4 x H200 (runtime per workload), continuous-batching "
       "serving runs on H100 (throughput and latencies) and training steps on 2 x H200."),
    code("from pathlib import Path\nfrom IPython.display import Image\nfrom aisim import plots\n"
         "from aisim.validation.report import compare, load_measurements\n"
         "DATA = Path('..') / 'validation' / 'data'\n"
         "for name in ('h100.jsonl', 'h200.jsonl', 'tp2-h200.jsonl', 'tp4-h200.jsonl'):\n"
         "    rows = compare(load_measurements([DATA / name]))\n"
         "    plots.estimated_vs_measured_png(rows, f'accuracy-{name[:-6]}.png', 'runtime_ms', f'runtime: {name}')\n"
         "    print(name, len(rows), 'rows')"),
    code("Image('accuracy-h100.png')"),
    code("Image('accuracy-tp4-h200.png')"),
    code("from aisim.validation import train_report\n"
         "t = train_report.rows()\n"
         "pts = [(r['class'], r['measured_ms'], r['estimated_ms']) for r in t if r.get('runtime_err_pct') is not None]\n"
         "plots.estimated_vs_measured_png(pts, 'accuracy-train.png', title='training step ms (2 x H200)')\n"
         "print(train_report.summary(t))\nImage('accuracy-train.png')"),
    code("from aisim.validation import serve_report\n"
         "s = serve_report.compare_runs()\n"
         "pts = [(k, r['measured'][k], r['estimated'][k]) for r in s for k in ('output_throughput', 'median_tpot_ms',\n"
         "       'median_ttft_ms')]\n"
         "plots.estimated_vs_measured_png(pts, 'accuracy-serve.png', title='serving runs (H100, transformers CB)')\n"
         "Image('accuracy-serve.png')"),
]

BOOKS = {"serving_capacity": SERVING, "training_plan": TRAINING, "accuracy": ACCURACY}


def build(name: str, timeout_s: int = 600) -> Path:
    nb = nbformat.v4.new_notebook(cells=BOOKS[name])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    for cell in nb.cells:   # tqdm's "IProgress not found" warning (a transformers import in a kernel without widgets)
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs
                            if not (o.get("name") == "stderr" and "TqdmWarning" in o.get("text", ""))]
    path = HERE / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    for name in sys.argv[1:] or list(BOOKS):
        print(build(name))
