"""The shape of the package: resolve once (Scenario), cost a step once (step_cost), studies on top; and the bugs
fixed with that reshape (each with its own test)."""
import ast
import inspect
import json
from pathlib import Path

import pytest

import aisim
from aisim import step
from aisim.errors import AisimError
from aisim.scenario import scenario
from aisim.workload import StepShape

ROOT = Path(aisim.__file__).resolve().parent
# Layers, lowest first: a module may import only from its own layer or below (graph/ and cost/ never reach up).
LAYERS = [
    {"errors", "units"},
    {"specs", "workload", "results"},
    {"graph", "formulas"},
    {"cost"},
    {"catalog", "plan", "scenario", "step"},
    {"studies"},
    {"api", "report", "plots", "cli", "__init__"},
]


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, names in enumerate(LAYERS) if top in names)


def _imports(path: Path) -> set[str]:
    """aisim modules imported by a file (relative imports resolved), as dotted names under aisim."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("aisim."):
                target = node.module[len("aisim."):]
            else:
                continue
            names = [target] if node.module else [f"{target}.{a.name}".strip(".") for a in node.names]
            out.update(n for n in names if n)
    return out


def _modules() -> dict[str, set[str]]:
    graph = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        graph[name] = {i for i in _imports(path) if not i.startswith("validation")}
    return graph


def test_prediction_never_imports_measurement_and_graph_cost_never_reach_up():
    for module, imports in _modules().items():
        for target in imports:
            assert _layer(target) <= _layer(module), f"{module} imports {target} (a layer above it)"


def test_import_graph_has_no_cycle():
    graph = _modules()
    known = set(graph)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: {r for i in imps if (r := resolve(i)) and r != m and not r.endswith("__init__")}
             for m, imps in graph.items()}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(trail + [node, nxt])}")
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for node in edges:
        if node not in state:
            visit(node, [])


def test_estimate_has_a_real_signature_and_documents_every_argument():
    params = inspect.signature(aisim.estimate).parameters
    assert "model" in params and "device" in params and "calibration" in params and len(params) > 20
    doc = aisim.estimate.__doc__
    assert all(f"{name}:" in doc for name in params), [n for n in params if f"{n}:" not in doc]


def test_a_step_is_costed_once():
    sc = scenario("opt-125m", "h100")
    shape = StepShape(phase="decode", batch=4, seq=256)
    assert step.step_cost(sc, shape) is step.step_cost(sc, shape)


def test_estimate_returns_typed_workload_and_plan():
    e = aisim.estimate(model="opt-125m", device="h100", workload="decode", batch=2, seq=128)
    assert e.workload.phase == "decode" and e.plan.tp == 1


# ---------------------------------------------------------------- bugs fixed with the reshape

def test_config_without_architectures_builds_the_same_graph(tmp_path):
    # the class comes from model_type as transformers' Auto classes pick it, so SDPA attention is kept
    _, config = aisim.catalog.resolve_model("opt-125m")
    bare = {k: v for k, v in config.items() if k != "architectures"}
    (tmp_path / "config.json").write_text(json.dumps(bare))
    named = aisim.estimate(model="opt-125m", device="h100", workload="prefill", batch=1, seq=256)
    unnamed = aisim.estimate(model=str(tmp_path / "config.json"), device="h100", workload="prefill", batch=1,
                             seq=256)
    assert unnamed.runtime_ms == pytest.approx(named.runtime_ms, rel=1e-9)


@pytest.mark.parametrize("name,repo", [("llama-3-70b", "meta-llama/Meta-Llama-3-70B"),
                                       ("llama-2-70b", "meta-llama/Llama-2-70b-hf"),
                                       ("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1"),
                                       ("mistral-7b", "mistralai/Mistral-7B-v0.1"),
                                       ("qwen2.5-7b", "Qwen/Qwen2.5-7B")])
def test_common_model_names_resolve(name, repo):
    assert aisim.catalog.resolve_model(name)[0] == repo


def test_device_accepts_a_spec_file_path():
    from importlib import resources
    path = Path(str(resources.files("aisim.hardware_specs"))) / "gpus" / "l4.yaml"
    assert aisim.estimate(model="opt-125m", device=path, workload="decode", seq=128).device == "l4"
    system = path.parent.parent / "systems" / "h200x4.yaml"
    e = aisim.estimate(model="opt-125m", device=str(system), workload="decode", batch=4, seq=128, tp=4)
    assert e.device == "h200x4"


def test_user_spec_directory_adds_gpus_and_calibrations(tmp_path, monkeypatch):
    from importlib import resources

    from aisim import specs
    shipped = Path(str(resources.files("aisim.hardware_specs")))
    (tmp_path / "gpus").mkdir()
    (tmp_path / "calibration").mkdir()
    text = (shipped / "gpus" / "l4.yaml").read_text().replace("name: l4", "name: my-l4", 1)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("aliases:"))
    (tmp_path / "gpus" / "my-l4.yaml").write_text(text)
    cal = (shipped / "calibration" / "h100-sxm.yaml").read_text().replace("device: h100-sxm", "device: my-l4")
    (tmp_path / "calibration" / "my-l4.yaml").write_text(cal)
    monkeypatch.setenv("AISIM_SPECS_DIR", str(tmp_path))
    specs.clear_caches()
    try:
        e = aisim.estimate(model="opt-125m", device="my-l4", workload="decode", seq=128)
        assert e.device == "my-l4" and e.calibrated   # the calibration the user directory holds is read
    finally:
        monkeypatch.delenv("AISIM_SPECS_DIR")
        specs.clear_caches()


def test_calibrate_writes_where_estimates_read(tmp_path, monkeypatch):
    from aisim.validation.calibrate import default_output
    monkeypatch.setenv("AISIM_SPECS_DIR", str(tmp_path))
    assert default_output("h100") == tmp_path / "calibration" / "h100-sxm.yaml"


def test_calibration_choice_auto_none_and_path():
    from importlib import resources
    auto = aisim.estimate(model="opt-125m", device="h100", workload="forward", batch=4, seq=512)
    none = aisim.estimate(model="opt-125m", device="h100", workload="forward", batch=4, seq=512, calibration="none")
    path = Path(str(resources.files("aisim.hardware_specs"))) / "calibration" / "h200.yaml"
    moved = aisim.estimate(model="opt-125m", device="h100", workload="forward", batch=4, seq=512,
                           calibration=str(path))
    # calibrated: a measurement of this GPU; another GPU's file, applied here, is not one (its note says whose)
    assert auto.calibrated and not none.calibrated and not moved.calibrated
    assert len({auto.runtime_ms, none.runtime_ms, moved.runtime_ms}) == 3
    assert any("measured on h200, applied to h100-sxm" in a for a in moved.assumptions)
    with pytest.raises(AisimError, match="auto, none, or the path"):
        aisim.estimate(model="opt-125m", device="h100", calibration="nowhere.yaml")
