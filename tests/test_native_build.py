"""The mypyc build of the engine modules (``setup.py``, ``sim.core.native_build``): the module
list is one list, which setup.py reads from ``sim.core.native_build``, and a build is whole --
every engine module compiled, or none."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

from sim.core.native_build import ENGINE_MODULES, interpreted_engine_modules

ROOT = Path(__file__).resolve().parents[1]


def test_setup_can_read_the_engine_modules_on_their_own():
    """setup.py runs sim/core/native_build.py on its own (the build environment has only the
    stdlib and the build requirements) and compiles each module from its ``.py`` source."""
    names = runpy.run_path(str(ROOT / "sim/core/native_build.py"))["ENGINE_MODULES"]
    assert names == ENGINE_MODULES
    assert all((ROOT / (name.replace(".", "/") + ".py")).is_file() for name in names)


def test_the_engine_modules_are_all_compiled_or_all_interpreted():
    interpreted = interpreted_engine_modules()
    built = importlib.util.find_spec("sim._engine__mypyc") is not None
    assert interpreted == ([] if built else list(ENGINE_MODULES))
