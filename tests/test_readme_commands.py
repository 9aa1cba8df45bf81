"""The README's set-up commands stay what CI runs: ``.ci/run`` calls exactly the README's test
command, and the first command installs no test extra (so the default run needs no torch, Ray or
Jupyter)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Set-up", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_ci_runs_exactly_the_readme_test_command():
    install_run, test = _setup_commands()
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    ci = [ln for ln in lines if ln.strip() and not ln.startswith(("#", "set ", "cd "))]
    assert ci == [test]
    assert test.endswith("python -m pytest -q -n auto --dist loadfile") and '".[test]"' in test


def test_first_command_installs_only_the_default_dependencies():
    install_run, _ = _setup_commands()
    assert "-m venv .venv" in install_run and "pip install -e . " in install_run
    assert "[" not in install_run  # no extra
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!\[ ]", d, maxsplit=1)[0].lower() for d in deps}
    assert not names & {"torch", "ray", "jupyter", "ipykernel", "nbclient", "notebook"}
