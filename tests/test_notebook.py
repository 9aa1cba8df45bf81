"""The analysis notebook executes end to end on a small sweep (nbclient)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.experiment.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "sweep_analysis.ipynb"


def test_notebook_runs_on_smoke_sweep(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    rep = run_sweep(ROOT / "configs" / "sweeps" / "smoke.yaml", workers=2, progress=False,
                    output_dir=str(tmp_path))
    assert not rep.errors
    monkeypatch.setenv("APCSIM_SWEEP_DIR", str(rep.folder))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # hit rate vs block size and capacity, TTFT x3, salt policies
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "sweep 'smoke': 8 points" in text
