"""Reproduce the graph TorchCAP's multi-GPU benchmark ran, on the CPU (no GPU, fake 8-rank process group), to read
which collectives it inserts and how much each rank holds (validation/harness_profiles/torchcap.yaml cites the
results). Not part of aisim; needs its own environment, as TorchCAP's Dockerfile had it:

    python -m venv /tmp/t26 && . /tmp/t26/bin/activate
    pip install torch==2.6.0 transformers==4.48.2 ortools pwlf tabulate matplotlib psutil
    git clone https://github.com/TorchCAP/TorchCAP /tmp/TorchCAP
    git -C /tmp/TorchCAP worktree add /tmp/TorchCAP-405e569 405e569     # the library of the OPT x 8 rows
    python validation/scripts/torchcap_tp_graph.py current --torchcap /tmp/TorchCAP --config CONFIG.json
    python validation/scripts/torchcap_tp_graph.py old --torchcap /tmp/TorchCAP-405e569 --config CONFIG.json \
        --layers 24 --batch 16 --seq 1024

CONFIG.json is an HF config (e.g. the model's config.json). ``current``: examples/huggingface/test_multi_gpu.py
@1022330 (AutoModelForCausalLM with labels, MLP-only ColwiseParallel/RowwiseParallel classes, torchcap.optimize =
export + TorchCAP's tensor_parallel_transformation). ``old``: the script @b4d3406 with the library @405e569
(AutoModel, style instances for q/k/v/fc1/fc2, torchcap.optimize = the auto-sharding ILP). Both on the host's
cluster file configs/a5000_24g_gala1.json. Prints the all-reduces by shape and the parameter bytes per rank;
``--estimate`` adds TorchCAP's own runtime and memory estimate of the graph."""
from __future__ import annotations

import argparse
import collections
import json
import sys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("harness", choices=["current", "old"])
    ap.add_argument("--torchcap", required=True, help="TorchCAP checkout (its repository root)")
    ap.add_argument("--config", required=True, help="HF config.json of the model")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--estimate", action="store_true", help="also run TorchCAP's own estimator on the graph")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    sys.path.insert(0, a.torchcap)
    import torchcap
    from torch.distributed.tensor.parallel.style import ColwiseParallel, RowwiseParallel
    from torchcap.cluster_env import ClusterEnv

    dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
    ClusterEnv.get_device_memory_capacity_bytes = staticmethod(lambda: 25757220864)   # RTX A5000 (old ILP)
    with open(a.config) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_aisim")}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.num_hidden_layers = a.layers
    ids = torch.randint(0, 10000, (a.batch, a.seq))
    current = a.harness == "current"
    with torch.device("meta"):
        model = (AutoModelForCausalLM if current else AutoModel).from_config(config, torch_dtype=torch.float16)
    model = model.to_empty(device="cpu").eval()
    if current:   # test_multi_gpu.py @1022330
        model.config.return_dict, model.config.use_cache = False, False
        colwise, rowwise, style = ("fc1", "gate_proj", "up_proj"), ("fc2", "down_proj"), lambda s: s
        args, kwargs = (), {"input_ids": ids, "labels": ids}
    else:         # test_multi_gpu.py @b4d3406: AutoModel, style instances, q/k/v column-parallel too
        colwise, rowwise, style = ("fc1", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), \
            ("fc2", "down_proj"), lambda s: s()
        args, kwargs = (ids,), {}
    plan = {n: style(ColwiseParallel) for n, _ in model.named_modules() if any(c in n for c in colwise)}
    plan |= {n: style(RowwiseParallel) for n, _ in model.named_modules() if any(r in n for r in rowwise)}
    cap = torchcap.CAPConfig(perf_model="roofline")
    cap.cluster_env = ClusterEnv.from_json(f"{a.torchcap}/configs/a5000_24g_gala1.json")
    topo = cap.cluster_env.mesh_topo
    topo.device_type = "cpu"
    topo.materialize(physical_mesh=list(range(8)))
    mod = torchcap.optimize(model, args, example_kwargs=kwargs, mesh_topo=topo, parallel_strategies=plan,
                            config=cap)
    graph, params = mod.graph, list(mod.parameters())
    shapes = collections.Counter(f"{tuple(n.meta['val'].shape)} {n.meta['val'].dtype}" for n in graph.nodes
                                 if n.op == "call_function" and "all_reduce" in str(n.target))
    print(f"all-reduces: {sum(shapes.values())}")
    for shape, count in shapes.most_common():
        print(f"  {count:4d} x {shape}")
    print(f"parameters per rank: {sum(p.numel() * p.element_size() for p in params) / 2**30:.3f} GiB")
    if a.estimate:
        info = torchcap.estimate(mod, args, example_kwargs=kwargs, config=cap)
        print(f"TorchCAP's estimate of this graph: {info.get_total_runtime() / 1e3:.1f} ms, "
              f"{info.peak_memory / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
