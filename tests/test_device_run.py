"""``gpu_backend/device/device_run.sh`` end to end on a CPU: every stage runs in its own process
and writes its results the moment it ends; what the device tool would bring back stays within its
limits; a missing package degrades the plan instead of crashing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("scipy")

ROOT = Path(__file__).resolve().parents[1]


def _env(extra_path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "TRITON_INTERPRET")}
    env["PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("device_run")
    out, res = tmp / "out", tmp / "results"
    p = subprocess.run(["bash", str(ROOT / "gpu_backend/device/device_run.sh"), "--device", "cpu", "--quick",
                        "--out", str(out), "--results", str(res)], env=_env(), capture_output=True, text=True,
                       timeout=1200)
    return p, out, res


def test_cpu_quick_runs_every_stage_and_returns_few_files(device_run):
    p, out, res = device_run
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    returned = sorted(f.name for f in out.iterdir())
    assert all((out / f).is_file() for f in returned) and len(returned) <= 8  # the device tool's limits
    assert {"preflight.json", "log.txt", "run.json", "correctness.json", "long_context.json", "bench.json",
            "calibration.tar.gz", "validation.tar.gz"} == set(returned)
    run = json.loads((out / "run.json").read_text())
    assert {k: v["status"] for k, v in run["stages"].items()} == dict.fromkeys(
        ("correctness", "long_context", "bench", "link", "calibration", "validation"), "ok")
    # the link stage rides in run.json: on a CPU its copies are host <-> host and say so, CUDA's skipped
    link = run["stages"]["link"]["summary"]
    assert link["measured"].startswith("host <-> host") and link["cuda_copies"].startswith("skipped")
    assert link["bandwidth_gb_s"] > 0 and {s["direction"] for s in link["samples"]} == {"h2h_store", "h2h_load"}
    assert json.loads((res / "link.json").read_text())["bandwidth_gb_s"] == link["bandwidth_gb_s"]
    assert run["git_commit"] and run["versions"]["torch"]
    corr = json.loads((out / "correctness.json").read_text())
    assert corr["ok"] and all(r["verify_block_tables"] for r in corr["cases"])
    assert {r["case"] for r in corr["cases"] if r["negative_control"]} == {"corrupt_shared_block", "top_left_mask",
                                                                         "corrupt_cpu_chunk"}
    assert {"cpu_load", "cpu_load_chunks", "cpu_random[0]"} <= {r["case"] for r in corr["cases"]}
    lc = json.loads((out / "long_context.json").read_text())
    assert lc["ok"] and lc["cases"][0]["facts"]["hit_blocks"] == lc["context_tokens"] // 16
    bench = json.loads((out / "bench.json").read_text())
    assert bench["steps"] and all(0 < r["pct_of_measured_matmul"] for r in bench["steps"])
    # the results layout: the model file the validation read, both reports with their targets
    from sim.timing.fitted_latency import FittedLatency

    model = FittedLatency.from_file(res / "model.json")
    assert model.metadata["fit"]["n_by_source"]["replay"] > 0  # calibrated on replay steps too
    for key in ("validate_chat", "validate_rag"):
        rep = json.loads((res / key / "report.json").read_text())
        assert rep["model"]["path"].endswith("model.json") and "targets" in rep
        assert "retimed" in rep["per_step"]


def test_unpack_rebuilds_the_results_layout(device_run, tmp_path):
    _, out, res = device_run
    from gpu_backend.device.device_stages import unpack

    got = unpack(out, tmp_path / "r")
    assert "calibration.tar.gz" in got and "validation.tar.gz" in got
    assert (tmp_path / "r" / "model.json").read_bytes() == (res / "model.json").read_bytes()
    assert (tmp_path / "r" / "validate_rag" / "pairs.csv").exists()
    with tarfile.open(out / "validation.tar.gz") as tar:
        assert "validate_chat/report.json" in tar.getnames()


def _shadow(tmp: Path, *names: str) -> str:
    """A folder that makes ``names`` fail to import (as on a device image without them)."""
    for n in names:
        (tmp / n).mkdir(parents=True)
        (tmp / n / "__init__.py").write_text(f"raise ImportError('{n} is shadowed for this test')\n")
    return str(tmp)


def test_preflight_names_each_missing_package_and_plans_around_it(tmp_path):
    shim = _shadow(tmp_path / "shim", "scipy", "pyarrow")
    p = subprocess.run([sys.executable, "-m", "gpu_backend.device.preflight", "--device", "cpu",
                        "--out", str(tmp_path)], env=_env(shim), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "MISSING scipy" in p.stdout and "MISSING pyarrow" in p.stdout
    rep = json.loads((tmp_path / "preflight.json").read_text())
    assert rep["plan"]["calibration"] == "skip: scipy missing" and rep["plan"]["validation"].startswith("skip")
    assert rep["plan"]["correctness"] == "run" and not rep["packages"]["pyarrow"]["ok"]
    assert rep["plan"]["link"] == "skip: scipy missing"
    # a stage the plan skips exits 3 at once and says so in run.json
    s = subprocess.run([sys.executable, "-m", "gpu_backend.device.device_stages", "calibration", "--device", "cpu",
                        "--results", str(tmp_path / "res"), "--out", str(tmp_path)], env=_env(shim),
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert s.returncode == 3
    assert json.loads((tmp_path / "run.json").read_text())["stages"]["calibration"]["status"] == "skip: scipy missing"


def test_device_run_without_cuda_stops_at_the_preflight(tmp_path):
    p = subprocess.run(["bash", str(ROOT / "gpu_backend/device/device_run.sh"), "--device", "cuda",
                        "--out", str(tmp_path), "--results", str(tmp_path / "r")],
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "sees no CUDA device" in p.stdout and "nothing else runs" in p.stdout


def test_csv_only_without_pyarrow(tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from sim.cli.main import main\n"
            f"sys.exit(main(['run', {str(ROOT / 'configs/quickstart_torch.yaml')!r}, '--out', {str(tmp_path)!r}, "
            "'--no-progress']))\n")
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "requests.csv").exists() and not (tmp_path / "requests.parquet").exists()
