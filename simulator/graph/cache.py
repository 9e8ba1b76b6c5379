"""The on-disk graph cache: plain JSON (nothing read back can execute), keyed on everything that shapes a graph.

The key hashes the model config, the workload, the plan, the torch and transformers versions and the source code
of the modules that build graphs (``CODE_HASH``: every file of aisim.graph plus the workload and dtype tables),
so a code change invalidates old entries without a hand-kept format version. Each entry stores the key's inputs
and is checked against them when read (another model's graph under a key is a miss, not an answer). Writes go to
a temporary file renamed into place; entries over ``MAX_ENTRY_BYTES`` are neither written nor read; each folder
keeps at most ``MAX_ENTRIES`` entries, oldest evicted first. ``AISIM_CACHE_DIR`` (default ``~/.cache/aisim``):
``graphs/`` here, ``configs/`` for model configs filled with their transformers class's defaults (aisim.catalog).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from .ops import Graph, Op, TensorMeta

MAX_ENTRY_BYTES = 64 * 2**20
MAX_ENTRIES = 4000
SUFFIX = ".graph.json"
_CODE_DIRS = ("graph",)
_CODE_FILES = ("workload.py", "units.py")


@functools.cache
def code_hash() -> str:
    """Hash of the source of every module that builds graphs (computed once per process)."""
    root = Path(__file__).resolve().parent.parent
    files = sorted(p for d in _CODE_DIRS for p in (root / d).glob("*.py")) + [root / f for f in _CODE_FILES]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def key_inputs(config: dict, traced: dict, plan: dict) -> str:
    """The canonical JSON of everything a graph depends on."""
    return json.dumps([config, traced, plan, version("torch"), version("transformers"), code_hash()],
                      sort_keys=True, default=str)


def cache_key(inputs: str) -> str:
    return hashlib.sha256(inputs.encode()).hexdigest()[:32]


def cache_root() -> Path:
    return Path(os.environ.get("AISIM_CACHE_DIR") or Path.home() / ".cache" / "aisim")


def cache_dir() -> Path:
    return cache_root() / "graphs"


def load(key: str, inputs: str) -> Graph | None:
    """The cached graph for ``key`` if its stored inputs match, else None (a miss: the caller traces)."""
    data = load_entry(cache_dir() / f"{key}{SUFFIX}", inputs)
    try:
        return None if data is None else _graph_from(data)
    except (ValueError, KeyError, TypeError):
        return None


def store(key: str, inputs: str, graph: Graph) -> None:
    """Write atomically (temporary file + rename); skip silently when the cache folder is not writable."""
    store_entry(cache_dir(), f"{key}{SUFFIX}", inputs, _graph_to(graph))


def load_entry(path: Path, inputs: str):
    """The JSON payload stored at ``path`` if its stored inputs equal ``inputs``, else None. Any entry of this
    cache (graphs, filled model configs) is plain JSON checked against its inputs."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_ENTRY_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            data = json.load(f, object_hook=_decode)
        if not isinstance(data, dict) or data.get("inputs") != inputs:
            return None
        return data["payload"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def store_entry(folder: Path, name: str, inputs: str, payload) -> None:
    """Write ``payload`` with its inputs atomically; skip silently when the folder is not writable."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"inputs": inputs, "payload": payload}, default=_encode)
        if len(text) > MAX_ENTRY_BYTES:
            return
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, folder / name)
        _evict(folder)
    except (OSError, TypeError, ValueError):   # not writable, or a payload JSON cannot hold: not cached
        return


def _evict(folder: Path) -> None:
    entries = list(folder.glob("*.json"))
    if len(entries) <= MAX_ENTRIES:
        return
    entries.sort(key=lambda p: p.stat().st_mtime)
    for path in entries[: len(entries) - MAX_ENTRIES]:
        path.unlink(missing_ok=True)


def _encode(value):
    if isinstance(value, TensorMeta):
        return {"__tensor": [list(value.shape), value.dtype]}
    raise TypeError(f"graph cache: cannot store {type(value).__name__}")


def _tuples(value):
    """JSON has no tuples: mark them so that op signatures compare equal after a round trip."""
    if isinstance(value, tuple):
        return {"__tuple": [_tuples(v) for v in value]}
    if isinstance(value, list):
        return [_tuples(v) for v in value]
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _decode(obj: dict):
    if "__tensor" in obj:
        shape, dtype = obj["__tensor"]
        return TensorMeta(tuple(int(d) for d in shape), str(dtype))
    if "__tuple" in obj:
        return tuple(obj["__tuple"])
    return obj


def _graph_to(g: Graph) -> dict:
    ops = [_tuples([op.name, op.args, op.kwargs, op.outputs, op.alias, op.phase, op.scope, op.attrs]) for op in g.ops]
    return {"ops": ops, "repeats": list(g.repeats), "param_count": g.param_count, "param_bytes": g.param_bytes,
            "peak_activation_bytes": g.peak_activation_bytes, "persistent_bytes": g.persistent_bytes,
            "layers": g.layers, "traced_layers": list(g.traced_layers), "meta": g.meta}


def _graph_from(d: dict) -> Graph:
    ops = [Op(name=str(n), args=tuple(a), kwargs=dict(k), outputs=tuple(o), alias=bool(al), phase=str(ph),
              scope=str(sc), attrs=dict(at)) for n, a, k, o, al, ph, sc, at in d["ops"]]
    if len(d["repeats"]) != len(ops):
        raise ValueError("graph cache entry: repeats and ops differ in length")
    return Graph(ops=ops, repeats=[float(r) for r in d["repeats"]], param_count=int(d["param_count"]),
                 param_bytes=float(d["param_bytes"]), peak_activation_bytes=float(d["peak_activation_bytes"]),
                 persistent_bytes=float(d["persistent_bytes"]), layers=int(d["layers"]),
                 traced_layers=tuple(d["traced_layers"]), meta=dict(d["meta"]))
