"""How long a step takes: latency models (fixed, roofline, fitted), the model / GPU specs they read,
step-time jitter (``step_noise``), and the simulated executor that implements
:class:`sim.core.executor.Executor` with them. Imports sim.core (and ``workloads.dists`` for seeded
streams) only; neither simpy nor torch.
"""
