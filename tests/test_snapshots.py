"""Snapshot of results: every case of ``tests/snapshots/digests_tool.py`` reproduces its recorded
table-column digests and summary exactly (``meta.json`` aside; new columns and keys are allowed).

A change that alters results on purpose re-records them in the same commit
(``python tests/snapshots/digests_tool.py --record``) and says why in the commit message.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("digests_tool", Path(__file__).parent / "snapshots" / "digests_tool.py")
assert _spec is not None and _spec.loader is not None
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

RECORDED = json.loads(tool.DIGESTS.read_text())


@pytest.mark.parametrize("case", tool.available_cases())
def test_results_match_snapshot(case: str, tmp_path: Path) -> None:
    assert case in RECORDED, f"{case} has no recorded snapshot; run digests_tool.py --record"
    problems = tool.compare(RECORDED[case], json.loads(json.dumps(tool.compute_case(case, tmp_path), default=str)))
    assert not problems, f"{case} changed:\n" + "\n".join(problems[:30])


def test_compare_flags_changed_and_missing_but_allows_new() -> None:
    old = {"summary": {"a": 1, "b": 2.5}, "requests": {"columns": {"x": "d1"}}}
    assert tool.compare(old, {"summary": {"a": 1, "b": 2.5, "c": 3}, "requests": {"columns": {"x": "d1", "y": "n"}}}) == []
    assert tool.compare(old, {"summary": {"a": 1, "b": 2.6}, "requests": {"columns": {}}}) == [
        "summary.b: 2.5 -> 2.6",
        "requests.columns.x: missing",
    ]
