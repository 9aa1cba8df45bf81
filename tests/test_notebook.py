"""The analysis notebook executes end to end on a fresh clone (nbclient): with no sweep folder it
runs the smoke sweep itself, then draws every figure."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "sweep_analysis.ipynb"


def test_notebook_runs_on_a_fresh_clone(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    missing = tmp_path / "sweeps" / "smoke"  # no sweep has run here
    monkeypatch.setenv("APCSIM_SWEEP_DIR", str(missing))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 6  # hit rate vs block size and capacity, TTFT x3, salt policies
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert f"no sweep in {missing}: running configs/sweeps/smoke.yaml" in text
    assert "sweep 'smoke': 8 points" in text
    assert (missing / "table.parquet").is_file() and (missing / "hit_rate_vs_block_size.png").is_file()
    markdown = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for policy in ("none", "per_tenant", "per_user", "per_session", "per_request", "shared_system_prompt"):
        assert f"`{policy}`" in markdown, policy
