"""Replicas on one clock behind routers (reserved layer: between sim.replay and sim.experiment).

Imports sim.replay, sim.timing and sim.core; never sim.experiment.
"""
