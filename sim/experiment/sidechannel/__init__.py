"""The timing side-channel experiment (``sidechannel:`` in a config, ``apcsim sidechannel``): what an
attacker learns from the time to first token of ordinary requests, per salt policy, load, block
size and noise. ``parties`` builds the victim's and the attacker's requests, ``point`` replays them
with the background workload through the normal replay and scores the attacks with
``statistics``. Mirrors nothing in vLLM; the engine is unchanged (probes are ordinary requests).
"""
