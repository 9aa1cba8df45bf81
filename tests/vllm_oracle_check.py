"""The comparison behind both vLLM agreement tests (``test_vllm_agreement``, hand-made traces, and
``test_vllm_agreement_real``, slices of the real traces): a replay's per-request results, summed
``PrefixCacheStats``, preemptions and step count against the oracle's CSV and stats files.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

STAT_FIELDS = ("requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")


def assert_matches_vllm(res: Any, expected_csv: Path, expected_stats: Path, async_scheduling: bool) -> None:
    """Every request's ``hit_tokens``, ``num_preemptions`` and ``readmit_hit_tokens``, the summed
    stats, the preemption count and the step count of ``res`` (a replay result) equal vLLM's
    (async: apcsim runs one trailing flush step, so it may have exactly one more)."""
    with open(expected_csv, newline="") as f:
        expected = {
            r["id"]: (int(r["hit_tokens"]), int(r["num_preemptions"]), r["readmit_hit_tokens"])
            for r in csv.DictReader(f)
        }
    stats = json.loads(expected_stats.read_text())
    got = {
        str(rid): (int(h), int(p), "" if rh is None else str(rh))
        for rid, h, p, rh in res.requests[
            ["request_id", "hit_tokens", "num_preemptions", "readmit_hit_tokens"]
        ].itertuples(index=False, name=None)
    }
    assert set(got) == set(expected)
    bad = {rid: {"vllm": expected[rid], "apcsim": got[rid]} for rid in expected if got[rid] != expected[rid]}
    assert not bad, f"{len(bad)} requests differ (hit_tokens, num_preemptions, readmit_hit_tokens): {bad}"
    ps = res.prefix_cache
    assert {k: getattr(ps, k) for k in STAT_FIELDS} == {k: stats[k] for k in STAT_FIELDS}
    assert int(res.summary["num_preemptions"]) == stats["total_preemptions"]
    extra_steps = len(res.steps) - stats["total_steps"]
    assert extra_steps in ((0, 1) if async_scheduling else (0,)), (len(res.steps), stats["total_steps"])
