"""The SimPy timeline: arrivals and engine steps on one clock (``engine``, the only module that
imports simpy), request intake (``intake``), one engine step's verbs (``step_runner``), the
synchronous and two-batch step loops (``sync_loop``, ``async_loop``), exact decode fast-forward
(``decode_window``), the per-request / per-step recorder and the summary metrics (``recorder``,
``metrics``). Imports sim.core and sim.timing.
"""
