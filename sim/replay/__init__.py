"""The SimPy timeline: arrivals and engine steps on one clock (``engine``, the only place that
imports simpy), exact decode fast-forward (``decode_window``), the per-request / per-step recorder
and the summary metrics (``recorder``, ``metrics``). Imports sim.core and sim.timing.
"""
