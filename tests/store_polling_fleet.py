"""The shared-store polling fleet of the KV-store tests: two replicas behind round robin over a store
with slow writes, and five requests whose routing puts ``a``, ``x`` and ``d`` on replica 0 and
``c`` and ``b`` on replica 1.

``b`` repeats ``a``'s 64-token prompt on the other replica, so it finds ``a``'s blocks in the store
while they are still being written and polls until the write lands. ``c`` decodes 300 tokens
meanwhile (decode windows), and ``x`` and ``d`` arrive while replica 0 has only its own write
pending. ``tests/test_kv_store.py`` (fast-forward equals step-by-step) and ``tests/test_kv_wake.py``
(routed requests are scheduled at their arrival) replay this one fleet under their own configs.
"""

from __future__ import annotations

import numpy as np

from sim.cluster.cluster import ClusterReplay, ClusterResult
from sim.experiment.cluster_run import build_router, replica_specs
from sim.experiment.cluster_store import build_store
from sim.experiment.config import ExperimentConfig
from sim.experiment.engine_description import resolve
from sim.experiment.run import build_latency, simulated_executor
from workloads.trace_format import TraceRequest

STORE = {"capacity_blocks": 100, "read_gb_s": 2.0, "write_gb_s": 0.01}
"""``cluster.kv_store`` of the fleet: 100 blocks, fast reads, writes slow enough to poll on."""


def replay_polling_fleet(cfg: ExperimentConfig) -> ClusterResult:
    """Replays the five requests on ``cfg``'s two-replica fleet (its ``cluster.kv_store`` is
    :data:`STORE`), with the integrity check on."""
    store = build_store(cfg, [resolve(cfg)] * 2)
    specs, _ = replica_specs(cfg, simulated_executor, build_latency, store)
    router, info = build_router(cfg)
    prompt = np.arange(1000, 1064)
    stream = [TraceRequest("a", 0.0, prompt, 2), TraceRequest("c", 0.001, np.arange(5000, 5040), 300),
              TraceRequest("x", 0.05, np.arange(9000, 9030), 3), TraceRequest("b", 0.1, prompt, 2),
              TraceRequest("d", 0.2, np.arange(7000, 7100), 50)]
    return ClusterReplay(specs, router, stream, router_info=info, integrity_check=True, kv_store=store).run()
