"""The notebooks in examples/ run, top to bottom, in a fresh kernel started in examples/ (as a
user opening them would): a notebook that no longer runs fails here instead of rotting.
Each uses a temporary ledger and run folders of its own, and small settings.

central.ipynb starts a local Ray of its own in its kernel, as on a user's machine; the others
join this test session's Ray through RAY_ADDRESS (as under ``ray job submit``): a Ray start
per notebook proved nothing more."""
import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = sorted(p.name for p in EXAMPLES.glob("*.ipynb"))


def test_every_trust_model_compare_budget_and_own_data_have_a_notebook():
    assert {"central.ipynb", "local.ipynb", "shuffle.ipynb", "compare_and_budget.ipynb",
            "own_data.ipynb"} <= set(NOTEBOOKS)
    readme = (EXAMPLES.parent / "README.md").read_text()
    assert "examples/" in readme


#: the notebook whose kernel starts its own local Ray
OWN_RAY = "central.ipynb"


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch, tmp_path, ray_session):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    root = str(EXAMPLES.parent)
    # the kernel imports this checkout (a worktree beside an editable install of another)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for key in ("RAY_ADDRESS", "RKNN_RAY_LEDGER"):     # the notebook's own ledger
        monkeypatch.delenv(key, raising=False)
    if name != OWN_RAY:
        monkeypatch.setenv("RAY_ADDRESS", ray_session.get_runtime_context().gcs_address)
    data_home = tmp_path / "data-home"                  # where the default ledger would go
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
        f"{name} is stored with outputs: clear them before committing"
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()            # raises CellExecutionError naming the cell that failed
    errors = [out for cell in nb.cells if cell.cell_type == "code"
              for out in cell.outputs if out.output_type == "error"]
    assert not errors
    # no import noise: tqdm's "IProgress not found", Ray's "Missing packages: ['ipywidgets']",
    # faiss's loader lines (rknn_ray/__init__.py quiets them)
    noise = [line for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
             for line in out.get("text", "").splitlines()
             if any(w in line for w in ("IProgress not found", "Missing packages", "faiss.loader"))]
    assert not noise, f"{name} printed: {noise}"
    shown = [out for cell in nb.cells[-2:] if cell.cell_type == "code" for out in cell.outputs]
    assert shown, f"{name}'s last cells showed nothing"
    assert not (data_home / "rknn-ray").exists(), f"{name} used the default ledger"
