"""A replay loads pandas and pyarrow only when it writes tables (issue 14: "import pandas and
pyarrow only when writing"). Building the config, the scheduler, the workload and the replay --
with the miss attribution on, whose table code is the easiest place to import pandas at module
level -- must not import either: on a slow host that import alone cost 0.56 s of a 9 s replay.

A whole ``apcsim run`` -- replay, summary, parquet tables -- never imports pandas at all: its
tables are ``sim.replay.table.Table`` columns written by pyarrow from their buffers (pyarrow's own
``pyarrow.array`` would import pandas for its type checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CODE = """
import sys
from sim.experiment.config import config_from_dict
from sim.experiment.run import build_latency, build_scheduler
from sim.experiment.workload import build_workload
from sim.replay.engine import Replay
from sim.timing.simulated_executor import SimulatedExecutor

cfg = config_from_dict({"name": "t", "engine": {"block_size": 16},
                        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 20}})
wl = build_workload(cfg)
for level in ("off", "summary", "full"):
    Replay(build_scheduler(cfg), SimulatedExecutor(build_latency(cfg)), wl.requests, attribution=level)
print(sorted(m for m in ("pandas", "pyarrow", "matplotlib", "torch", "ray") if m in sys.modules))
"""


def test_building_a_replay_imports_no_table_library() -> None:
    res = subprocess.run([sys.executable, "-c", _CODE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout


_RUN = """
import sys
from sim.cli.main import main
sys.argv = ["apcsim", "run", sys.argv[1], "--no-bounds", "--no-progress", "--out", sys.argv[2]]
main()
print(sorted(m for m in ("pandas", "matplotlib", "torch", "ray") if m in sys.modules))
"""


def test_a_run_writes_its_tables_without_pandas(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("name: t\nengine: {block_size: 16}\n"
                   "workload: {kind: synthetic_shared_prefix, num_requests: 20}\n")
    res = subprocess.run([sys.executable, "-c", _RUN, str(cfg), str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
    assert (tmp_path / "out" / "requests.parquet").exists() and (tmp_path / "out" / "steps.parquet").exists()
