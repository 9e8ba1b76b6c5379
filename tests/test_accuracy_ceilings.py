"""Accuracy regression gate: every committed measured dataset, estimated on the CPU, must stay under the per-category
MAPE ceilings written beside the goals in aisim.validation.accuracy (the value when set, plus half a point)."""
from aisim import formulas, step
from aisim.validation import accuracy


def test_every_ceiling_names_a_committed_dataset():
    committed = {name for name, _ in accuracy.DATASETS if (accuracy.DATA_DIR / name).exists()}
    assert set(accuracy.CEILINGS) <= committed


def test_committed_datasets_stay_under_their_ceilings():
    assert accuracy.ceiling_violations() == []


def _doubled_flops(original):
    def broken(op):
        c = original(op)
        return formulas.Cost(2 * c.flops, c.bytes_read, c.bytes_written, c.launches, c.kind)
    return broken


def test_a_broken_formula_fails_the_ceilings(monkeypatch):
    """The gate can fail: double every matmul's FLOPs (a deliberately broken formula) and runtime ceilings trip."""
    for name in ("aten.mm", "aten.addmm", "aten.bmm"):
        monkeypatch.setitem(formulas.FORMULAS, name, _doubled_flops(formulas.FORMULAS[name]))
    step.clear_caches()
    try:
        violations = accuracy.ceiling_violations()
    finally:
        step.clear_caches()
    assert any("runtime" in v for v in violations), violations
