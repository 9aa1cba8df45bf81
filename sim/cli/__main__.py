"""``python -m sim.cli``: the same as the ``apcsim`` command (mirrors ``python -m vllm.entrypoints.cli.main``).

Invariants: only calls ``sim.cli.main.main``. Imports that and sys only.
"""

import sys

from sim.cli.main import main

sys.exit(main())
