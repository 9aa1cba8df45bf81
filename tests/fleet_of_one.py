"""The ``replicas: 1`` equality that fleet tests assert: a fleet of one replica replays exactly what
the single engine replays -- the replica's tables and summary, and the fleet's tables and summary
(less its ``cluster`` section)."""

from __future__ import annotations

from typing import Any

import pandas as pd

RUN_KEYS = ("skipped_bad_lines", "vllm_version")
"""Summary keys of the run (the fleet summary's), not of a replica."""


def replica_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """What a replica's summary holds of a single engine's ``summary``: all but :data:`RUN_KEYS`."""
    return {k: v for k, v in summary.items() if k not in RUN_KEYS}


def assert_fleet_of_one_equals_single(single: Any, cl: Any, router: str) -> None:
    r0 = cl.replicas[0]
    pd.testing.assert_frame_equal(single.requests, r0.requests)
    pd.testing.assert_frame_equal(single.steps, r0.steps)
    assert r0.summary == replica_summary(single.summary)
    pd.testing.assert_frame_equal(single.requests, cl.requests[list(single.requests.columns)])
    pd.testing.assert_frame_equal(single.steps, cl.steps[list(single.steps.columns)])
    assert {k: v for k, v in cl.summary.items() if k != "cluster"} == single.summary, router
