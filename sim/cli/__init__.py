"""The ``apcsim`` command line (mirrors the ``vllm`` CLI's parse-and-dispatch): parse, call one
experiment function, print (``main``). Invariants: no simulation logic here. Imports neither
torch nor gpu_backend.

A replay runs on one thread, and a sweep runs one replay per worker process, so the command asks
OpenBLAS (numpy's BLAS) for one thread unless the environment says otherwise: its thread pool is
started when numpy is imported and spins for a while (0.05-0.1 CPU seconds of every run, measured
with perf) and would oversubscribe the cores under a sweep's workers. Set ``OPENBLAS_NUM_THREADS`` to override;
it takes effect only where numpy is not imported yet (the command's own process and its workers).
The command's process also runs the cyclic GC's first generation as a replay does
(``sim.replay.gc_policy``) from the start: importing pydantic, the config models, numpy and
pyarrow otherwise triggers some sixty passes.
"""

import gc
import os

from sim.replay.gc_policy import REPLAY_GC_THRESHOLD

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
gc.set_threshold(REPLAY_GC_THRESHOLD, *gc.get_threshold()[1:])
