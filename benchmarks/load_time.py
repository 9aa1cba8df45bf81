"""What loading a trace costs apcsim: the CPU and wall seconds of reading a config's whole workload.

``bench_vs_blis.py`` runs this in a fresh process beside every ``apcsim run``, to set apcsim's load
against the BLIS harness's own ``load_seconds`` (the wall time from opening the JSONL to the last
request injected into its event queue; issue 14's target: under 25 % of it on the same file).

Measured here: building the config's workload (``sim.experiment.workload.build_workload``, which
reads nothing yet) and iterating its request stream to the end -- the scanner's parse of every line
into a ``TraceRequest`` with its token runs, exactly what ``apcsim run`` feeds the replay. Imports
are timed apart (``import_cpu_s``), as they are not a cost of the file. Prints one JSON object:
``{"requests", "prompt_tokens", "import_cpu_s", "load_cpu_s", "load_wall_s"}``.

    python benchmarks/load_time.py CONFIG
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    c0 = time.process_time()
    sys.path.insert(0, str(ROOT))
    from sim.core.errors import ApcsimError
    from sim.experiment.config import load_config
    from sim.experiment.engine_description import resolve
    from sim.experiment.workload import build_workload

    import_cpu = time.process_time() - c0
    try:
        cfg = load_config(sys.argv[1])
        engine = resolve(cfg)  # the engine's block size shapes the workload's description, not the reading
        c1, t1 = time.process_time(), time.perf_counter()
        n = tokens = 0
        for r in build_workload(cfg, engine).requests:
            n += 1
            tokens += len(r.tokens)
    except ApcsimError as exc:  # a bad config or trace line: its one-line message, no traceback
        sys.exit(f"load_time.py: {exc}")
    print(json.dumps({"requests": n, "prompt_tokens": tokens, "import_cpu_s": round(import_cpu, 4),
                      "load_cpu_s": round(time.process_time() - c1, 4),
                      "load_wall_s": round(time.perf_counter() - t1, 4)}))


if __name__ == "__main__":
    main()
