"""The CPU offload tier's worker for one resolved engine (mirrors nothing in vLLM: the simulated
worker half of its OffloadingConnector, ``sim.replay.kv_transfer``, over the engine's link).

Invariant: the one place a worker is derived from an ``EngineDescription`` (its
``offload_bandwidth_gb_s``, ``offload_link_latency_s``, ``offload_link_duplex`` and
``kv_bytes_per_block``); the single engine
(``sim.experiment.run``) and every replica of a fleet (``sim.experiment.cluster_run``, one per
incarnation) call it. Imports neither simpy nor torch.
"""

from __future__ import annotations

from sim.experiment.engine_description import EngineDescription
from sim.replay.kv_transfer import LinkKVWorker
from sim.timing.transfer_link import TransferLink


def build_kv_worker(engine: EngineDescription) -> LinkKVWorker | None:
    """A fresh worker whose transfers cross one link of the engine's ``offload_bandwidth_gb_s`` and
    per-transfer ``offload_link_latency_s``, one lane per direction unless ``offload_link_duplex`` is
    false; None without a tier."""
    if engine.offload is None:
        return None
    return LinkKVWorker(TransferLink(engine.offload_bandwidth_gb_s, engine.offload_link_latency_s,
                                     engine.offload_link_duplex),
                        engine.kv_bytes_per_block)
