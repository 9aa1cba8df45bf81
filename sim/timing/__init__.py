"""How long a step takes: latency models (fixed, roofline, fitted), the model / GPU specs they read,
and the simulated executor that implements :class:`sim.core.executor.Executor` with them.
Imports sim.core only; neither simpy nor torch.
"""
