"""``bench_vs_blis.py --fleet`` says why there is no fleet row against BLIS (issue 38 item 5): what it
finds in the harness folder, then the reasons that hold whatever the folder holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_vs_blis import CLI_TRACE_REASON, ROUTER_REASON, fleet_blockers  # noqa: E402


def _peers(tmp_path: Path, source: str | None, built: bool) -> Path:
    harness = tmp_path / "blis_harness"
    harness.mkdir()
    if source is not None:
        (harness / "main.go").write_text(source)
    if built:
        binary = harness / "blisharness"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    return tmp_path


@pytest.mark.parametrize(("source", "built", "single", "unbuilt"), [
    (None, False, "absent", True),
    ("s, err := sim.NewSimulator(cfg, rec, lat)", False, "drives one sim.NewSimulator", True),
    ("s, err := sim.NewSimulator(cfg, rec, lat)", True, "drives one sim.NewSimulator", False),
    ("cs := cluster.NewClusterSimulator(config, src, nil)", True, None, False),
])
def test_fleet_blockers_name_what_the_harness_folder_lacks(tmp_path: Path, source: str | None, built: bool,
                                                           single: str | None, unbuilt: bool) -> None:
    reasons = fleet_blockers(_peers(tmp_path, source, built))
    cluster = [r for r in reasons if "no cluster mode" in r]
    assert len(cluster) == (single is not None) and all(single in r for r in cluster if single is not None)
    assert any(r.startswith("no built harness") for r in reasons) == unbuilt
    # the CLI's trace format and the routers' signals do not depend on the harness folder
    assert reasons[-2:] == [CLI_TRACE_REASON, ROUTER_REASON]


def test_fleet_flag_prints_the_reasons_and_fails_without_running(tmp_path: Path) -> None:
    peers = _peers(tmp_path, "sim.NewSimulator", False)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_vs_blis.py"), "--fleet", "--peers",
                          str(peers), "--work", str(tmp_path / "work")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.returncode == 1
    assert out.stdout.startswith("fleet row against BLIS: NOT MEASURED")
    assert "TraceV2" in out.stdout and "round robin matches" in out.stdout
    assert not (tmp_path / "work").exists()  # no input built, nothing run
