"""The mypyc build of the engine modules (``setup.py``, ``sim.core.native_build``): the module
list is one list, and a build is whole -- every engine module compiled, or none."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from sim.core.native_build import ENGINE_MODULES, interpreted_engine_modules

ROOT = Path(__file__).resolve().parents[1]


def _setup_mypyc_modules() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_MYPYC_MODULES" for t in targets):
                return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[union-attr]
    raise AssertionError("setup.py has no _MYPYC_MODULES")


def test_setup_compiles_exactly_the_engine_modules():
    paths = _setup_mypyc_modules()
    assert [p.removesuffix(".py").replace("/", ".") for p in paths] == list(ENGINE_MODULES)
    assert all((ROOT / p).is_file() for p in paths)


def test_the_engine_modules_are_all_compiled_or_all_interpreted():
    interpreted = interpreted_engine_modules()
    built = importlib.util.find_spec("sim._engine__mypyc") is not None
    assert interpreted == ([] if built else list(ENGINE_MODULES))
