"""Result snapshots: content digests of the tables and summaries that a fixed set of runs writes.

A *snapshot* pins what apcsim computes, independently of how it is written: for each case (the
quickstart, every ``configs/`` experiment that replays on the CPU in under a minute, and each point
of the smoke sweep) it stores

* per table (``requests``, ``steps``): the row count and a SHA-256 digest of every column (dtype
  kind and raw values: numbers by their bytes, everything else by ``repr``), so a parquet-writer or
  pandas upgrade does not change a digest while any changed value does;
* ``summary.json`` itself (small, so a diff shows which metric moved).

Each case runs under one vLLM version profile (``engine.vllm_version``, passed as ``--set``): the
cases recorded before version profiles existed run under 0.25.1, which must reproduce them exactly;
the ``*_v033`` cases pin the 0.33.0 profile (the default since) on the same configs.

``meta.json`` (wall times, versions, commit) is excluded. A new column or summary key is allowed
(listed, not failed); a changed or missing one fails ``tests/test_snapshots.py``.

Re-record after a change that alters results *on purpose* (and say why in the commit message)::

    python tests/snapshots/digests_tool.py --record

``--check`` compares without writing; ``--case NAME`` limits either to some cases.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = Path(__file__).with_name("digests.json")
SHARED_TRACES = ROOT.parent / "shared" / "traces"

V0251, V033 = "0.25.1", "0.33.0"

RUN_CASES: dict[str, tuple[str, bool] | tuple[str, bool, str]] = {
    # name: (config path relative to the repository, needs ../shared/traces[, vLLM version; default 0.25.1])
    "quickstart": ("configs/quickstart.yaml", False),
    "mooncake_sample": ("configs/mooncake_sample.yaml", False),  # the single-engine quickstart before the cluster one
    "quickstart_torch_sim": ("configs/quickstart_torch.yaml", False),
    "agent_synthetic": ("configs/agent_synthetic.yaml", False),
    "chat_synthetic": ("configs/chat_synthetic.yaml", False),
    "rag_synthetic": ("configs/rag_synthetic.yaml", True),  # Azure arrivals
    "azure_code": ("configs/azure_code.yaml", True),
    "validate_chat_cpu": ("configs/validate_chat_cpu.yaml", False),
    "validate_rag_cpu": ("configs/validate_rag_cpu.yaml", False),
    "chat_mooncake": ("configs/chat_mooncake.yaml", True),
    "rag_ragpulse": ("configs/rag_ragpulse.yaml", True),
    "agent_trace": ("configs/agent_trace.yaml", True),
    # the 0.33.0 profile: a fleet (8 replicas, the sglang router), one engine on a real-trace sample,
    # a synthetic agent workload and a Mooncake slice with preemptions
    "quickstart_v033": ("configs/quickstart.yaml", False, V033),
    "mooncake_sample_v033": ("configs/mooncake_sample.yaml", False, V033),
    "agent_synthetic_v033": ("configs/agent_synthetic.yaml", False, V033),
    "chat_mooncake_v033": ("configs/chat_mooncake.yaml", True, V033),
}
SWEEP_CASE = "smoke_sweep"
SWEEP_FILE = "configs/sweeps/smoke.yaml"
SWEEP_VOLATILE = ("wall_time_s", "bounds_wall_time_s", "worker", "worker_peak_rss_mib", "key")
"""Sweep table columns that are not results (wall times, worker, the config-hash point key)."""


def column_digest(values: pd.Series) -> str:
    """SHA-256 of a column's dtype kind and values (numbers by bytes, the rest by repr)."""
    arr = values.to_numpy()
    h = hashlib.sha256()
    if arr.dtype.kind in "biuf":
        h.update(f"{arr.dtype.kind}{arr.dtype.itemsize}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    else:
        h.update(b"O")
        for v in arr:
            if isinstance(v, float) and np.isnan(v):
                v = None  # pandas may write a missing string as NaN or None
            h.update(repr(v).encode())
            h.update(b"\0")
    return h.hexdigest()


def table_digest(df: pd.DataFrame) -> dict[str, Any]:
    return {"rows": len(df), "columns": {c: column_digest(df[c]) for c in df.columns}}


def _read_table(folder: Path, name: str) -> pd.DataFrame | None:
    if (folder / f"{name}.parquet").exists():
        return pd.read_parquet(folder / f"{name}.parquet")
    if (folder / f"{name}.csv").exists():
        return pd.read_csv(folder / f"{name}.csv")
    return None


def folder_digest(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("requests", "steps"):
        df = _read_table(folder, name)
        if df is not None:
            out[name] = table_digest(df)
    out["summary"] = json.loads((folder / "summary.json").read_text())
    return out


def _cli(argv: list[str]) -> None:
    from sim.cli.main import main

    rc = main(argv)
    if rc != 0:
        raise RuntimeError(f"apcsim {' '.join(argv)} exited with {rc}")


def compute_case(name: str, workdir: Path) -> dict[str, Any]:
    """Run one case into ``workdir`` and return its digest record."""
    if name == SWEEP_CASE:
        _cli(["sweep", str(ROOT / SWEEP_FILE), "--output-dir", str(workdir), "--no-plots", "--no-progress",
              "--workers", "1", "--set", f"engine.vllm_version={V0251}"])
        folder = workdir / "smoke"
        table = pd.read_parquet(folder / "table.parquet")
        points: dict[str, Any] = {}
        for _, row in table.iterrows():
            label = f"bs={row['block_size']},gib={row['engine.kv_cache_gib']},salt={row['workload.tenants.salt']}"
            points[label] = folder_digest(folder / "points" / row["key"])
        stable = table.drop(columns=[c for c in SWEEP_VOLATILE if c in table.columns])
        return {"table": table_digest(stable), "points": points}
    config, version = RUN_CASES[name][0], (RUN_CASES[name][2:] or (V0251,))[0]
    out = workdir / name
    # --no-bounds: the offline references are new summary keys (allowed), pinned by their own tests;
    # computing them for every case would add about a minute and a half to the snapshot test
    _cli(["run", str(ROOT / config), "--out", str(out), "--no-progress", "--no-bounds",
          "--set", f"engine.vllm_version={version}"])
    return folder_digest(out)


def available_cases() -> list[str]:
    names = [n for n, case in RUN_CASES.items() if not case[1] or SHARED_TRACES.is_dir()]
    return names + [SWEEP_CASE]


def compare(expected: dict[str, Any], actual: dict[str, Any], path: str = "") -> list[str]:
    """Differences of ``actual`` from ``expected``; keys only in ``actual`` are allowed (new)."""
    problems: list[str] = []
    for key, want in expected.items():
        where = f"{path}.{key}" if path else key
        if key not in actual:
            problems.append(f"{where}: missing")
            continue
        got = actual[key]
        if isinstance(want, dict) and isinstance(got, dict):
            problems.extend(compare(want, got, where))
        elif want != got and not (_is_nan(want) and _is_nan(got)):
            problems.append(f"{where}: {want!r} -> {got!r}")
    return problems


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and v != v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true", help="run the cases and write digests.json")
    mode.add_argument("--check", action="store_true", help="run the cases and compare with digests.json")
    p.add_argument("--case", action="append", default=None, help="only this case (repeatable)")
    args = p.parse_args(argv)
    names = args.case or available_cases()
    stored = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            got = json.loads(json.dumps(compute_case(name, Path(tmp)), default=str))
            if args.record:
                stored[name] = got
                print(f"recorded {name}")
                continue
            problems = compare(stored.get(name, {}), got) if name in stored else ["not recorded"]
            failed += bool(problems)
            print(f"{name}: {'ok' if not problems else 'CHANGED'}")
            for line in problems[:20]:
                print(f"  {line}")
    if args.record:
        DIGESTS.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
