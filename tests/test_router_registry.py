"""The router registry (``sim.cluster.routers``): every configurable kind resolves to its Router
class, an unknown kind is one clear error, and building a router imports its own module only."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sim.cluster.router import Router
from sim.cluster.routers import ROUTERS, make_router, router_class
from sim.experiment.cluster_config import ROUTER_TAGS


def test_every_configurable_kind_is_a_router_class() -> None:
    assert set(ROUTERS) == ROUTER_TAGS
    for kind in ROUTERS:
        assert issubclass(router_class(kind), Router)


def test_an_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown router 'nope'; choose one of round_robin, random"):
        make_router("nope", 0)


def test_building_a_router_imports_its_module_only() -> None:
    code = ("import sys; from sim.cluster.routers import make_router; make_router('dynamo', 0); "
            "print(sorted(m for m in ('sim.cluster.llm_d_router', 'sim.cluster.sglang_router', "
            "'sim.cluster.basic_routers', 'sim.cluster.dynamo_router') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['sim.cluster.dynamo_router']"
