"""The committed notebooks execute on the CPU without an error (nbclient), so they cannot rot."""
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    # executed in memory (the committed .ipynb is not rewritten) from the notebooks folder, where their relative
    # data paths resolve; the PNGs they write there are regenerated the same
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors


def test_there_are_three_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"serving_capacity", "training_plan", "accuracy"}
