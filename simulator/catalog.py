"""Name resolution: what users type (``a6000x8``, ``opt-6.7b``, ``facebook/opt-6.7b``, a config path) to specs."""
from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .errors import AisimError, UnknownNameError
from .specs import (Device, HardwareSpec, InterconnectSpec, SystemSpec, load_yaml, all_hardware, all_systems,
                    parse_spec)

MAX_GPUS = 100_000  # beyond any built cluster: bounds the default-plan search
# GPUs one NVSwitch / Infinity Fabric host joins (HGX H100/H200/B200 and MI300X platforms: 8 per board); more
# switch-fabric GPUs than that are several nodes, which a multi-node system spec (SYSTEMxN) describes
HOST_SWITCH_GPUS = 8
_MULTI = re.compile(r"^(?P<gpu>.+?)\s*[x×]\s*(?P<n>\d+)$")

# Architecture rules for a host with no system spec file (docs/specs.md says where each comes from).
PCIE_BW_PER_LANE_BYTES_PER_S = {3: 0.985e9, 4: 1.969e9, 5: 3.938e9}  # PCIe base spec, per direction
PCIE_ACHIEVED_FRACTION = 0.80      # TLP/DLLP protocol overhead, typical achieved DMA fraction
NVLINK_ACHIEVED_FRACTION = 0.80    # NCCL bus bandwidth / NVLink unidirectional peak on NVSwitch systems
COLLECTIVE_LATENCY_PCIE_S = 50e-6  # NCCL small-message all-reduce latency over PCIe (nccl-tests order of magnitude)
COLLECTIVE_LATENCY_NVLINK_S = 15e-6


def _gpu_index() -> dict[str, str]:
    index = {}
    for key, spec in all_hardware().items():
        for alias in [key, spec.name, *spec.aliases]:
            index[alias.lower()] = key
    return index


def resolve_gpu(name: str) -> HardwareSpec:
    """A GPU spec by any of its names: file stem, ``name``, an alias, or the name the driver reports."""
    index = _gpu_index()
    key = index.get(name.strip().lower())
    if key is None:
        raise UnknownNameError("device", name, sorted(all_hardware()) + sorted(all_systems()),
                               "Run `aisim list devices` for all names; append xN for N GPUs (a6000x8).")
    return all_hardware()[key]


def _default_interconnect(gpu: HardwareSpec, count: int) -> tuple[InterconnectSpec, str]:
    pcie_bw = PCIE_BW_PER_LANE_BYTES_PER_S.get(gpu.pcie_gen, 1.969e9) * gpu.pcie_lanes * PCIE_ACHIEVED_FRACTION
    if gpu.nvlink_kind == "switch" and gpu.nvlink_bw_bytes_per_s:
        bw = gpu.nvlink_bw_bytes_per_s / 2 * NVLINK_ACHIEVED_FRACTION
        ic = InterconnectSpec(kind="nvswitch", algorithm="ring", link_bw_bytes_per_s=bw,
                              latency_s=COLLECTIVE_LATENCY_NVLINK_S, source="architecture rule (catalog.py)")
        fabric = {"nvidia": "an NVSwitch fabric", "amd": "AMD Infinity Fabric links"}.get(gpu.vendor, "a switched GPU fabric")
        beyond = (f" (no host joins more than {HOST_SWITCH_GPUS} such GPUs: {count} are several nodes, whose "
                  "collectives cross the network; a multi-node system spec as SYSTEMxN, e.g. h100x8-ndrx2, prices "
                  "that)" if count > HOST_SWITCH_GPUS else "")
        return ic, (f"no system spec file for {gpu.name}x{count}: assumed {fabric} at {bw / 1e9:.0f} GB/s per GPU per "
                    f"direction{beyond}")
    if gpu.nvlink_kind == "bridge" and gpu.nvlink_bw_bytes_per_s and count == 2:
        bw = gpu.nvlink_bw_bytes_per_s / 2 * NVLINK_ACHIEVED_FRACTION
        ic = InterconnectSpec(kind="nvlink-bridge", algorithm="ring", link_bw_bytes_per_s=bw,
                              latency_s=COLLECTIVE_LATENCY_NVLINK_S, source="architecture rule (catalog.py)")
        return ic, f"no system spec file for {gpu.name}x{count}: assumed the 2 GPUs joined by an NVLink bridge at {bw / 1e9:.0f} GB/s per direction"
    ic = InterconnectSpec(kind="pcie", algorithm="ring", link_bw_bytes_per_s=pcie_bw,
                          latency_s=COLLECTIVE_LATENCY_PCIE_S, source="architecture rule (catalog.py)")
    return ic, (f"no system spec file for {gpu.name}x{count}: assumed PCIe gen{gpu.pcie_gen} x{gpu.pcie_lanes} "
                f"through the host, {pcie_bw / 1e9:.1f} GB/s per GPU per direction")


def resolve_device(name) -> Device:
    """``h100`` -> one GPU; ``a6000x8`` -> a system spec file if one exists, else 8 GPUs on default links; a path
    to a GPU or system YAML file -> that spec (validated like the shipped ones)."""
    if isinstance(name, Device):
        return name
    if isinstance(name, Path) or str(name).endswith((".yaml", ".yml")):
        return _device_from_file(Path(name).expanduser())
    text = str(name).strip().lower()
    if not text:
        raise AisimError("--device is empty; give a GPU name (h100), NAMExN (a6000x8) or a spec YAML path")
    system = _system_named(text)
    if system is not None:
        return _system_device(system)
    nodes = _nodes_of_system(text)
    if nodes is not None:
        return nodes
    match = _MULTI.match(text)
    if match and text not in _gpu_index():
        # a GPU whose name ends in x (mi300x) written NAMEN after it: mi300x8 is mi300x x 8
        base = match["gpu"] if match["gpu"] in _gpu_index() or f"{match['gpu']}x" not in _gpu_index() \
            else f"{match['gpu']}x"
        gpu, count = resolve_gpu(base), int(match["n"])
        if not 1 <= count <= MAX_GPUS:
            raise AisimError(f"device {name!r}: the GPU count must be between 1 and {MAX_GPUS}")
        nodes = _nodes_of_gpus(gpu, count, text)
        if nodes is not None:
            return nodes
    else:
        gpu, count = resolve_gpu(text), 1
    return gpu_device(gpu, count)


def node_gpus(dev: Device) -> int:
    """The GPUs one host of ``dev`` joins: a system's node (gpus_per_node) or its whole count; NAMExN with no system
    file, at most HOST_SWITCH_GPUS of a switch-fabric GPU (more are several nodes), else all of them."""
    if dev.system is not None:
        return dev.system.gpus_per_node or dev.system.gpu_count
    return min(dev.count, HOST_SWITCH_GPUS) if dev.gpu.nvlink_kind == "switch" else dev.count


def spans_nodes(dev: Device) -> bool:
    """Whether ``dev`` is several nodes of a multi-node system (its collectives across nodes priced over the
    network)."""
    system = dev.system
    return bool(system is not None and system.network is not None and system.gpus_per_node
                and dev.count > system.gpus_per_node)


def node_system(gpu: HardwareSpec) -> SystemSpec | None:
    """The first multi-node system file (gpus_per_node and a network; shipped or the user's) of ``gpu``, by name."""
    return next((spec for _, spec in sorted(all_systems().items()) if spec.gpu == gpu.name
                 and spec.network is not None and spec.gpus_per_node), None)


def gpus_device(gpu: HardwareSpec, count: int) -> Device:
    """``count`` GPUs of ``gpu`` as NAMExN resolves them: one host (gpu_device), or whole nodes of the GPU's
    multi-node system past one host's NVSwitch GPUs."""
    return _nodes_of_gpus(gpu, count, f"{count} {gpu.name} GPUs") or gpu_device(gpu, count)


def _nodes_of_gpus(gpu: HardwareSpec, count: int, label: str) -> Device | None:
    """NAMExN with more switch-fabric GPUs than one host joins (h100x16): whole nodes of the GPU's multi-node system
    (h100x8-ndr x 2), said in a note; None where there is none or N is not whole nodes (default links then)."""
    system = node_system(gpu) if gpu.nvlink_kind == "switch" and count > HOST_SWITCH_GPUS else None
    if system is None or count % system.gpus_per_node:
        return None
    nodes = count // system.gpus_per_node
    dev = multi_node(_system_device(system), nodes)
    note = (f"{label}: no host joins more than {HOST_SWITCH_GPUS} such GPUs, so {nodes} nodes of "
            f"{system.name} ({system.network.nics_per_node} x {system.network.nic_bw_bytes_per_s / 1e9:g} GB/s "
            f"{system.network.kind} per node; name another multi-node system as SYSTEMxN)")
    return replace(dev, assumptions=dev.assumptions + (note,))


def _system_named(text: str) -> SystemSpec | None:
    return next((spec for spec in all_systems().values()
                 if text in {spec.name.lower(), *(a.lower() for a in spec.aliases)}), None)


def _nodes_of_system(text: str) -> Device | None:
    """``SYSTEMxN``: N nodes of a multi-node system (``h100x8-ndrx16``). A one-host system's name with ``xN``
    (``h100x8x16``) means N nodes of the shipped multi-node system with that GPU and node size, said in a note."""
    match = _MULTI.match(text)
    base = _system_named(match["gpu"]) if match else None
    if base is None:
        return None
    nodes, note = int(match["n"]), None
    if base.network is None:
        fabrics = sorted(spec.name for spec in all_systems().values() if spec.network is not None
                         and spec.gpu == base.gpu and spec.gpus_per_node == base.gpu_count)
        if not fabrics:
            known = ", ".join(sorted(spec.name for spec in all_systems().values() if spec.network is not None))
            raise AisimError(f"device {text!r}: {base.name} is one host with no inter-node network; give N nodes of a "
                             f"multi-node system as SYSTEMxN ({known}), or a system YAML with gpus_per_node and "
                             "network")
        base = _system_named(fabrics[0])
        note = (f"{text}: {nodes} nodes of {base.name} ({base.network.nics_per_node} x "
                f"{base.network.nic_bw_bytes_per_s / 1e9:g} GB/s {base.network.kind} per node)")
    dev = multi_node(_system_device(base), nodes)
    return replace(dev, assumptions=dev.assumptions + ((note,) if note else ()))


def multi_node(dev: Device, nodes: int) -> Device:
    """``nodes`` nodes of a multi-node system device: gpus_per_node x nodes GPUs whose collectives run
    hierarchically (aisim.cost.comm.collective_s)."""
    system = dev.system
    if nodes == 1:
        return dev
    if system is None or system.network is None or system.gpus_per_node is None:
        raise AisimError(f"--nodes needs a multi-node system spec (with gpus_per_node and network), e.g. a100x8-hdr "
                         f"or h100x8-ndr; {dev.name} has none")
    if dev.count > system.gpus_per_node:
        raise AisimError(f"--nodes {nodes}: {dev.name} is already {dev.count // system.gpus_per_node} nodes of "
                         f"{system.gpus_per_node} GPUs; give --nodes with one node's name (e.g. h100x8-ndr) or the "
                         "device alone")
    if not 1 <= nodes <= MAX_GPUS // system.gpus_per_node:
        raise AisimError(f"device {dev.name}: the node count must be between 1 and "
                         f"{MAX_GPUS // system.gpus_per_node}")
    count = system.gpus_per_node * nodes
    spec = system.model_copy(update={"name": f"{system.name}x{nodes}", "gpu_count": count})
    return replace(dev, count=count, system=spec)


def gpu_device(gpu: HardwareSpec, count: int) -> Device:
    """``count`` GPUs of one kind: a system spec file for that pair if one is shipped, else default links."""
    matches = [spec for spec in all_systems().values() if spec.gpu == gpu.name and spec.gpu_count == count]
    for spec in sorted(matches, key=lambda spec: spec.network is not None):   # one host before a cluster's node
        return _system_device(spec)
    if count == 1:
        ic = InterconnectSpec(kind="none", algorithm="ring", link_bw_bytes_per_s=0.0, latency_s=0.0,
                              source="single GPU")
        return Device(gpu=gpu, count=1, system=None, interconnect=ic)
    ic, assumed = _default_interconnect(gpu, count)
    larger = _larger_box(gpu, count, ic.kind)
    if larger is not None:   # what cost.comm._intra_link reads for such a group: say that, not the rule's link
        assumed = (f"no system spec file for {gpu.name}x{count}: its collectives read {larger.name}'s measured or "
                   f"documented links ({larger.interconnect.link_bw_bytes_per_s / 1e9:.0f} GB/s bus bandwidth, its "
                   "latency scaled to the group's GPUs by NCCL's ring model; a group with a file of its size reads "
                   "that)")
    return Device(gpu=gpu, count=count, system=None, interconnect=ic, assumptions=(assumed,))


def _larger_box(gpu: HardwareSpec, count: int, kind: str) -> SystemSpec | None:
    """The smallest one-host system file of ``gpu`` on an NVLink fabric with more than ``count`` GPUs (None for
    other fabrics): the file cost.comm prices a NAMExN group without a file of its own from."""
    from .cost.comm import systems_of

    if kind not in ("nvswitch", "nvlink-bridge"):
        return None
    return min((spec for spec in systems_of(gpu, kind) if spec.gpu_count > count), key=lambda spec: spec.gpu_count,
               default=None)


def _system_device(spec: SystemSpec) -> Device:
    return Device(gpu=resolve_gpu(spec.gpu), count=spec.gpu_count, system=spec, interconnect=spec.interconnect)


def path_exists(path: Path, flag: str, test) -> bool:
    """``test(path)`` (Path.is_file or is_dir), with an unusable path (too long, ...) as one AisimError line."""
    try:
        return test(path)
    except (OSError, ValueError) as exc:
        raise AisimError(f"--{flag} {str(path)[:80]!r}: not a usable path ({getattr(exc, 'strerror', None) or exc})"
                         ) from None


def _device_from_file(path: Path) -> Device:
    if not path_exists(path, "device", Path.is_file):
        raise AisimError(f"device spec {str(path)!r} does not exist; give a GPU or system YAML file, or a name "
                         "(`aisim list devices`)")
    data = load_yaml(path)
    if "gpu_count" in data:
        spec = parse_spec(SystemSpec, data, path)
        try:
            return _system_device(spec)
        except UnknownNameError:
            raise AisimError(f"{path}: gpu: {spec.gpu!r} is not a known GPU; name one of `aisim list devices` (h100, "
                             "a100-sxm4-80gb, ...) or add its spec under hardware_specs/gpus/") from None
    return gpu_device(parse_spec(HardwareSpec, data, path), 1)


# ---------------------------------------------------------------- models

MAX_CONFIG_BYTES = 4 * 2**20
# Config keys that must be positive integers where present (HF names across families).
POSITIVE_INT_KEYS = ("hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers",
                     "encoder_layers", "decoder_layers", "num_attention_heads", "n_head", "num_key_value_heads",
                     "intermediate_size", "ffn_dim", "n_inner", "vocab_size", "max_position_embeddings",
                     "n_positions", "num_local_experts", "num_experts", "num_experts_per_tok", "head_dim",
                     "moe_intermediate_size", "sliding_window")
MAX_DIM = 10_000_000
# config.json torch_dtype / dtype values transformers turns into a torch.dtype (getattr(torch, name)), and "auto"
TORCH_DTYPE_NAMES = frozenset({"auto", "float32", "float", "float64", "double", "float16", "half", "bfloat16",
                               "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                               "float4_e2m1fn_x2", "int8", "uint8", "int16", "int32", "int64", "bool"})


def _model_dir() -> Path:
    return Path(str(resources.files("aisim.model_specs")))


def common_names(full: str) -> set[str]:
    """The names a user types for a shipped config: the HF repo id, the name after the organisation, and that name
    without a vendor prefix or a release suffix (Meta-Llama-3-70B -> llama-3-70b, Llama-2-70b-hf -> llama-2-70b,
    Mixtral-8x7B-v0.1 -> mixtral-8x7b)."""
    short = full.split("/")[-1].lower()
    bare = re.sub(r"^meta-", "", short)
    bare = re.sub(r"(-hf|-v\d+(\.\d+)*)+$", "", bare)
    return {full.lower(), short, bare}


@lru_cache(maxsize=None)
def model_index() -> dict[str, Path]:
    """Every shipped config by file stem and by its common names (first claim wins)."""
    index: dict[str, Path] = {}
    for path in sorted(_model_dir().glob("*.json")):
        try:
            full = _read_config(path).get("_name_or_path") or path.stem
        except AisimError as exc:  # one broken shipped config must not break every command
            warnings.warn(f"skipped model spec {exc}", UserWarning, stacklevel=2)
            continue
        if not isinstance(full, str):
            full = path.stem
        for alias in sorted({path.stem.lower()} | common_names(full)):
            index.setdefault(alias, path)
    return index


def model_names() -> list[str]:
    names = []
    for path in sorted(set(model_index().values())):
        full = _read_config(path).get("_name_or_path")
        names.append(full if isinstance(full, str) and full else path.stem)
    return sorted(names)


def resolve_model(name) -> tuple[str, dict]:
    """A shipped name (with or without organisation, or a common short name) or a path to a local HF config.json
    (or its folder) -> (name, config), checked: a mapping with a known model_type, positive integer dimensions, and
    no custom code."""
    if isinstance(name, Path):
        name = str(name)
    if not isinstance(name, str) or not name.strip():
        raise AisimError("--model is empty; give a shipped name (`aisim list models`) or a path to a config.json")
    path = Path(name).expanduser()
    if name.endswith(".json") or path_exists(path, "model", Path.is_dir):
        if path.is_dir():
            path = path / "config.json"
        if not path_exists(path, "model", Path.is_file):
            raise AisimError(f"model config {str(path)!r} does not exist; give a path to an HF config.json "
                             "or a shipped name (`aisim list models`).")
        config, filled = with_model_defaults(_read_config(path))
        if filled:
            config = {**config, DEFAULTS_KEY: filled}
        # a model folder's config.json is named by its folder; any other file by its own name
        fallback = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        return _display_name(config, fallback), config
    found = model_index().get(name.strip().lower())
    if found is None:
        raise UnknownNameError("model", name, model_names() + [n.split("/")[-1] for n in model_names()],
                               "Run `aisim list models`, or pass a path to a local HF config.json.")
    config, _ = with_model_defaults(_read_config(found))
    return _display_name(config, found.stem), config


# config.json fields a transformers config class declares that do not change the architecture: filled like the others,
# never named in the note
QUIET_DEFAULTS = frozenset({"output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
                            "is_encoder_decoder", "use_cache", "initializer_range", "bos_token_id", "eos_token_id",
                            "pad_token_id", "attention_dropout", "router_jitter_noise", "pretraining_tp",
                            "tie_word_embeddings", "rope_interleave", "scale_attn_weights"})
DEFAULTS_KEY = "_aisim_defaults"


def with_model_defaults(config: dict) -> tuple[dict, dict]:
    """_fill_model_defaults, kept on disk (aisim.graph.cache ``configs/``, keyed on the config, the transformers
    version and this code) so that a new process with a cached graph need not import transformers and torch."""
    from .graph import cache

    inputs = json.dumps([config, cache.version("transformers"), cache.code_hash(), _catalog_hash()], sort_keys=True,
                        default=str)
    path = cache.cache_root() / "configs" / f"{cache.cache_key(inputs)}.json"
    stored = cache.load_entry(path, inputs)
    if isinstance(stored, list) and len(stored) == 2 and all(isinstance(x, dict) for x in stored):
        return stored[0], stored[1]
    filled = _fill_model_defaults(config)
    if filled is None:             # transformers could not build it: the tracer says why; nothing is cached
        return config, {}
    cache.store_entry(path.parent, path.name, inputs, list(filled))
    return filled


@lru_cache(maxsize=1)
def _catalog_hash() -> str:
    import hashlib

    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _fill_model_defaults(config: dict) -> tuple[dict, dict] | None:
    """(config, filled): the config with every field its transformers config class declares (or computes, as
    gpt-oss's layer_types) and the file leaves out, at the value the built config holds (HF builds the model from
    it, and aisim's readers of the config.json then see the same model), and the architecture fields so filled
    (not the ones the file gives under an alias, attribute_map). A config transformers cannot build is left to the
    tracer's error."""
    import inspect

    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .graph.build import make_config

    try:
        cls = CONFIG_MAPPING[config["model_type"]]
        built = make_config(config).to_dict()
    except Exception:  # noqa: BLE001 - unknown type or values transformers refuses: the tracer says which
        return None
    params = {k: p for k, p in inspect.signature(cls.__init__).parameters.items()
              if k != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    # PretrainedConfig's own fields (labels, dtype, version...) and the rope dict transformers derives from the
    # file's rope fields are not architecture fields of the file
    generic = (set(inspect.signature(PretrainedConfig.__init__).parameters) | set(PretrainedConfig().to_dict())
               | {"rope_parameters"}) - {"tie_word_embeddings"}
    aliased = {real for alias, real in getattr(cls, "attribute_map", {}).items() if alias in config}
    filled = {k: built[k] for k in (set(params) | {"layer_types"}) - generic
              if k not in config and built.get(k) is not None}
    if not filled:
        return config, {}
    # named: a class default taken as it is (not a value transformers derived from the file's other fields)
    noted = {k: v for k, v in filled.items() if k not in QUIET_DEFAULTS and k not in aliased and k in params
             and params[k].default == v and v is not False and v != 0 and k != "layer_types"}
    if "layer_types" in filled and set(filled["layer_types"]) != {"full_attention"}:
        noted["layer_types"] = ", ".join(f"{n} x {t}" for t, n in _runs(filled["layer_types"]))
    return {**config, **filled}, noted


def _runs(values: list) -> list[tuple[object, int]]:
    """Counts of each distinct value, in first-seen order."""
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return list(out.items())


def defaults_note(config: dict) -> str | None:
    """The note naming the architecture fields a user's config.json left out (with_model_defaults), if any."""
    filled = config.get(DEFAULTS_KEY)
    if not filled:
        return None
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(filled.items()))
    return (f"config.json leaves out {len(filled)} field(s) its transformers class declares: their defaults, which "
            f"HF builds the model with, are used ({shown}); add them to the file if the model differs")


def _display_name(config: dict, fallback: str) -> str:
    name = config.get("_name_or_path")
    return name if isinstance(name, str) and name.strip() else fallback


def _read_config(path: Path) -> dict:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise AisimError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; not an HF config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise AisimError(f"{path}: not valid JSON ({type(exc).__name__}); give an HF config.json") from None
    except OSError as exc:
        raise AisimError(f"{path}: cannot be read ({exc.strerror})") from None
    check_config(config, str(path))
    return config


def check_config(config, where: str) -> None:
    """Refuse configs aisim cannot use safely: not a mapping, no model_type, a dimension that is not a positive
    integer, or custom code (``auto_map``): aisim never runs code from a config."""
    if not isinstance(config, dict):
        raise AisimError(f"{where}: a config.json must be a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise AisimError(f"{where}: no 'model_type'; give an HF config.json (model_type names the architecture)")
    if config.get("auto_map"):
        auto_map = config["auto_map"]
        asked = sorted(map(str, auto_map)) if isinstance(auto_map, (dict, list)) else repr(auto_map)
        from transformers import CONFIG_MAPPING

        builtin = model_type in CONFIG_MAPPING
        raise AisimError(f"{where}: the config asks for custom code (auto_map: {asked}); aisim never runs code from "
                         "a config. Remove 'auto_map'" + (
                             f" (model_type {model_type!r} is built into transformers and is used as it is)"
                             if builtin else " and set 'model_type' to the built-in transformers architecture it "
                             f"follows (e.g. llama, mistral, qwen2), not {model_type!r}"))
    for key in POSITIVE_INT_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
            raise AisimError(f"{where}: {key} must be a positive integer up to {MAX_DIM:,} (got {value!r})")
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise AisimError(f"{where}: num_key_value_heads {kv} does not divide num_attention_heads {heads} (each KV head "
                         "serves a whole group of query heads); give a divisor of it")
    hidden = config.get("hidden_size")
    if heads and hidden and not config.get("head_dim") and hidden % heads:
        raise AisimError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; give "
                         "head_dim or a hidden_size that is")
    # the key transformers 5 reads (dtype, else the older torch_dtype); a dict gives one per sub-config
    key = "dtype" if config.get("dtype") is not None else "torch_dtype"
    value = config.get(key)
    names = list(value.values()) if isinstance(value, dict) else [value]
    if value is not None and not all(isinstance(v, str) and v in TORCH_DTYPE_NAMES for v in names):
        raise AisimError(f"{where}: {key} {value!r} is not a torch dtype; write one transformers reads (e.g. "
                         "bfloat16, float16, float32) or remove the key")
