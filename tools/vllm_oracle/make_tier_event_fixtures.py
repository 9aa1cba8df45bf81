#!/usr/bin/env python3
"""Regenerate ``tests/fixtures/vllm_oracle_033/tier_events/``: the KV-event batches vLLM 0.33.0
publishes with its native CPU offloading, for some cases of the offload agreement manifest
(``tests/fixtures/vllm_oracle_033/offload/manifest.json``).

Each case runs through ``oracle.py`` (vLLM's own ``Scheduler`` / ``AsyncScheduler``, the
``OffloadingConnector`` over a ``CPUOffloadingManager``, the stub worker) with KV events on (the
oracle's ``--events-out``: ``KVEventsConfig(enable_kv_cache_events=True, publisher="null")``). The
scheduler's publisher is wrapped, so every ``KVEventBatch`` that ``Scheduler.update_from_output``
publishes -- the block pool's events, then the connector's (``connector.take_events()``) -- is
written with the number of ``schedule()`` calls made so far. ``--self-describing`` turns on the
connector's ``self_describing_kv_events`` (``OffloadingEventsTracker.self_describing_enabled``).

DEV-ONLY. Run it with venv033's python from this folder::

    VLLM_LOGGING_LEVEL=ERROR venv033/bin/python make_tier_event_fixtures.py

Output per case and mode: ``<case>[.sd].events.jsonl``, one line per published batch:
``{"schedules": n, "events": [{"type": ..., <the event's fields>}]}`` (hashes as vLLM's ints).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "vllm_oracle_033"
OUT = FIXTURES / "tier_events"
CASES = ("scan_reuse_lru", "scan_reuse_arc", "preempt_resume", "repeat32_async", "pending_defer")


def run_case(oracle, name: str, case: dict, trace: Path, self_describing: bool, out: Path) -> int:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import events as off_events

    argv = case["oracle_command"].split()[2:]  # "python oracle.py <trace> ..."
    argv[0] = str(trace)
    tmp = Path(tempfile.mkdtemp())
    for flag in ("--out", "--stats-out"):
        argv[argv.index(flag) + 1] = str(tmp / flag.strip("-"))
    argv += ["--events-out", str(tmp / "gpu_events.jsonl")]
    batches: list[dict] = []
    orig_build = oracle.build_engine
    orig_init = off_events.OffloadingEventsTracker.__init__

    def init(self, config, group_specs=None):
        orig_init(self, config, group_specs)
        if self_describing:
            assert config.enable_kv_cache_events
            self.self_describing_enabled = True

    def build(args, max_model_len):
        eng = orig_build(args, max_model_len)
        sched = eng.scheduler
        calls = [0]
        orig_schedule = sched.schedule

        def schedule(*a, **kw):
            calls[0] += 1
            return orig_schedule(*a, **kw)

        def publish(batch):
            batches.append({"schedules": calls[0],
                            "events": [oracle.event_to_json(e, 0) | {"step": None} for e in batch.events]})

        sched.schedule = schedule
        sched.kv_event_publisher.publish = publish
        return eng

    oracle.build_engine = build
    off_events.OffloadingEventsTracker.__init__ = init
    try:
        oracle.replay(oracle.parse_args(argv, batch_ok=False))
    finally:
        oracle.build_engine = orig_build
        off_events.OffloadingEventsTracker.__init__ = orig_init
    with open(out, "w") as f:
        for b in batches:
            for e in b["events"]:
                del e["step"]
            f.write(json.dumps(b) + "\n")
    return len(batches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.path.insert(0, str(HERE))
    import oracle

    manifest = json.loads((FIXTURES / "offload" / "manifest.json").read_text())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in CASES:
        case = manifest["cases"][name]
        trace = FIXTURES / "offload" / case["trace"]
        for sd in (False, True):
            path = out / f"{name}{'.sd' if sd else ''}.events.jsonl"
            n = run_case(oracle, name, case, trace, sd, path)
            print(f"{path.name}: {n} batches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
