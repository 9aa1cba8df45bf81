"""vLLM 0.33.0's native CPU KV offload tier (the ``OffloadingConnector`` over a
``CPUOffloadingManager``), for ``sim.core.scheduler``: the CPU manager and its LRU/ARC policies,
the connector's scheduler side, the scheduler's connector path (``admission``), and a stub worker.
Imports neither simpy nor torch.
"""
