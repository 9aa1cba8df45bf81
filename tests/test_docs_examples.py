"""Executable docs: every ```bash block of the README and docs/ whose first command is ``apcsim``
runs here, in order per page, in a scratch folder holding a copy of the repository's ``configs/``
and a link to its ``workloads/`` (so a block never writes into the checkout); a ```text block right
after it is what the block prints, compared line by line with its stdout, timings aside (wall and
CPU seconds are masked). An expected block ending in a line ``...`` is compared with the first
lines of the output only, one starting with ``...`` with its last lines. A doc that drifts from the
code fails here; the blocks keep their own inputs small (``--set workload.limit=...`` where a run
would be long).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)
_TIMINGS = (
    (re.compile(r"[\d.,]+ (?:ms|s) wall"), "<t> wall"),
    (re.compile(r"\(\+ [\d.,]+ (?:ms|s) for the bounds\)"), "(+ <t> for the bounds)"),
    (re.compile(r"; [\d.,]+ s$", re.M), "; <t> s"),
)


@dataclass(frozen=True)
class Example:
    """One ```bash block: its page, line, script and the output shown after it (or None)."""

    page: Path
    line: int
    script: str
    expected: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(pages: list[Path] = PAGES) -> list[Example]:
    """The ``apcsim`` blocks of ``pages``, in page order, each with the ```text block after it."""
    found = []
    for page in pages:
        text = page.read_text()
        fences = list(_FENCE.finditer(text))
        for i, m in enumerate(fences):
            lines = [ln.strip() for ln in m.group(2).splitlines() if ln.strip() and not ln.strip().startswith("#")]
            if m.group(1) != "bash" or not lines or not lines[0].startswith("apcsim "):
                continue
            nxt = fences[i + 1] if i + 1 < len(fences) else None
            expected = None
            if nxt is not None and nxt.group(1) == "text" and not text[m.end():nxt.start()].strip():
                expected = nxt.group(2)
            found.append(Example(page, text[:m.start()].count("\n") + 1, m.group(2), expected))
    return found


def normalize(out: str) -> list[str]:
    """``out``'s lines without trailing blanks and with timings masked."""
    for pattern, repl in _TIMINGS:
        out = pattern.sub(repl, out)
    lines = [ln.rstrip() for ln in out.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def differs(expected: str, actual: str) -> str | None:
    """None when ``actual`` prints what ``expected`` shows, else the first differing line."""
    want, got = normalize(expected), normalize(actual)
    if want and want[-1] == "...":  # the first lines only
        want, got = want[:-1], got[: len(want) - 1]
    elif want and want[0] == "...":  # the last lines only
        want, got = want[1:], got[len(got) - len(want) + 1:]
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            return f"line {i + 1}:\n  shown:   {w!r}\n  printed: {g!r}"
    if len(want) != len(got):
        return f"shown {len(want)} lines, printed {len(got)}"
    return None


_WORKSPACES: dict[Path, Path] = {}


def _workspace(page: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch folder per page (a page's blocks may read what an earlier block wrote)."""
    if page not in _WORKSPACES:
        ws = tmp_path_factory.mktemp(page.stem)
        shutil.copytree(ROOT / "configs", ws / "configs")  # a block may write beside a config (apcsim convert)
        (ws / "workloads").symlink_to(ROOT / "workloads")  # the bundled traces, read only
        _WORKSPACES[page] = ws
    return _WORKSPACES[page]


EXAMPLES = examples()


def test_the_docs_have_examples_and_the_quickstart_is_one() -> None:
    ids = [e.script.strip() for e in EXAMPLES]
    assert "apcsim run configs/quickstart.yaml" in ids
    assert len(EXAMPLES) >= 8 and sum(e.expected is not None for e in EXAMPLES) >= 4


def test_a_changed_figure_or_a_missing_line_is_caught() -> None:
    shown = "run: 600 requests replayed in 1.46 s wall (+ 0.346 s for the bounds)\nhit rate 0.137\n"
    assert differs(shown, shown.replace("1.46", "9.99").replace("0.346", "2")) is None  # timings only
    assert differs(shown, shown.replace("0.137", "0.138")) is not None
    assert differs(shown, shown + "extra line\n") is not None
    assert differs("hit rate 0.137\n...\n", "hit rate 0.137\nanything\nelse\n") is None
    assert differs("...\nhit rate 0.137\n", "anything\nelse\nhit rate 0.137\n") is None
    assert differs("...\nhit rate 0.137\n", "hit rate 0.137\nelse\n") is not None


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_doc_example_runs_and_prints_what_is_shown(example: Example,
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    ws = _workspace(example.page, tmp_path_factory)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", example.script], cwd=ws, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{example.id} exited {proc.returncode}:\n{proc.stderr[-2000:]}"
    if example.expected is not None:
        problem = differs(example.expected, proc.stdout)
        assert problem is None, f"{example.id}: the output shown differs from what the command prints, {problem}"
