"""Import aisim for the tests that exercise measurement code: from a source tree that is not installed, map
aisim -> simulator/ and aisim.X -> X/ (the package-dir mapping of pyproject.toml)."""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ensure_aisim(probe: str = "aisim.validation") -> bool:
    """Import aisim; from a source tree that is not installed, map aisim -> simulator/, aisim.X -> X/.
    Returns True if aisim is really installed (spawned processes can then import it too)."""
    try:
        importlib.import_module(probe)
        return True
    except ImportError:
        pass
    for name in [m for m in sys.modules if m == "aisim" or m.startswith("aisim.")]:
        del sys.modules[name]

    def package(name: str, path: Path):
        init = path / "__init__.py"
        if init.exists():
            spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(path)])
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = types.ModuleType(name)
            module.__path__ = [str(path)]
            sys.modules[name] = module
        return module

    root = package("aisim", ROOT / "simulator")
    for sub in ("validation", "model_specs", "hardware_specs"):
        setattr(root, sub, package(f"aisim.{sub}", ROOT / sub))
    return False
