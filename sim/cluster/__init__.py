"""Replicas on one clock behind routers: ``cluster`` (the replay), ``replica`` (one exact engine fed
by the router), ``router`` (the interface) and its implementations (``basic_routers``,
``llm_d_router``, ``dynamo_router``, ``sglang_router``, ``ttft_routers``), the router-side
indexes (``prefix_index``, ``token_tree``, ``kv_view``), the KV-event pipeline and the cluster
summary.

Imports sim.replay, sim.timing, sim.core and workloads; never sim.experiment.
"""
