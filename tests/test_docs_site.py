"""The front door stays a front door: the README is a short front page without commit hashes or
performance history, every relative link of the README and docs/ points at a file and heading that
exist, the docs site builds with ``mkdocs build --strict``, and the config reference page is the one
generated from the pydantic models (its JSON Schema accepts the shipped configs and refuses a typo)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.experiment.config import config_from_dict, config_to_dict, load_config
from sim.experiment.config_schema import config_json_schema, render_reference
from sim.experiment.config_show import render_values, resolved_values
from sim.experiment.engine_description import resolve

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_a_front_page_without_hashes_or_history() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert hashes == []
    for heading in ("## Set-up", "## Quickstart", "## Features", "## Fidelity", "## Documentation"):
        assert heading in text


def test_every_docs_page_is_under_about_400_lines_but_the_generated_reference() -> None:
    long = [p.name for p in PAGES if len(p.read_text().splitlines()) > 400 and p.name != "config_reference.md"]
    assert long == []


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs' toc give a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]", "", heading.strip().lower()).replace("_", "")
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_relative_link_resolves_to_a_file_and_heading(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for m in _LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif page.parent.name == "docs" and ROOT / "docs" not in dest.parents:
            broken.append(f"{target} (outside docs/: mkdocs cannot follow it)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == []


def test_the_slug_rule_matches_a_heading_with_code_and_punctuation() -> None:
    assert _slug("Timing side channel: what `cache_salt` hides") == "timing-side-channel-what-cachesalt-hides"
    assert _slug("Fidelity: checked against vLLM 0.33.0 itself") == "fidelity-checked-against-vllm-0330-itself"


def test_docs_build_strictly_with_mkdocs(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")  # in the test extra; the plain install has no docs builder
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "config_reference" / "index.html").exists()


def test_the_committed_config_reference_is_the_generated_one() -> None:
    assert (ROOT / "docs" / "config_reference.md").read_text() == render_reference(), (
        "docs/config_reference.md is stale: run `apcsim config reference > docs/config_reference.md`")


def test_the_reference_lists_every_engine_key_with_its_vllm_flag() -> None:
    ref = render_reference()
    section = ref.split("## EngineConfig", 1)[1].split("\n## ", 1)[0]
    from sim.experiment.config import EngineConfig

    for key in EngineConfig.model_fields:
        assert f"| `{key}` |" in section
    assert "| `block_size` | int > 0, <= 4096 | `16` | tokens | `--block-size` |" in section


def test_the_json_schema_accepts_the_shipped_configs_and_refuses_a_typo() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(json.dumps(config_json_schema()))
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    checked = 0
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if "grid" in data or "zip" in data:  # a sweep file, not an experiment
            continue
        assert list(validator.iter_errors(data)) == [], path.name
        checked += 1
    assert checked >= 15
    bad = yaml.safe_load((ROOT / "configs" / "my_trace.yaml").read_text())
    bad["engine"]["blok_size"] = 16
    assert [e.message for e in validator.iter_errors(bad)] != []
    bad["engine"].pop("blok_size")
    bad["engine"]["block_size"] = "sixteen"
    assert list(validator.iter_errors(bad)) != []


def test_config_show_names_each_values_source(tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: exp\nengine: {block_size: 32}\nworkload: {kind: chat, sessions: 5}\n"
                   "cluster: {replicas: 2, router: sglang}\n")
    values = {v.key: (v.value, v.source) for v in resolved_values(cfg, ["workload.sessions=7",
                                                                        "cluster.router=dynamo"])}
    assert values["name"] == ("exp", "file") and values["engine.block_size"] == (32, "file")
    assert values["workload.sessions"] == (7, "--set") and values["seed"] == (0, "default")
    assert values["cluster.router.kind"] == ("dynamo", "--set")
    assert values["cluster.router.overlap_credit"][1] == "default"  # the override gave the kind only
    engine = resolve(load_config(cfg))
    assert values["engine.num_gpu_blocks"] == (engine.num_gpu_blocks, "derived")
    assert values["engine.max_model_len"] == (engine.max_model_len, "derived")


def test_config_show_prints_a_valid_config_equal_to_the_resolved_one(tmp_path: Path) -> None:
    cfg = ROOT / "configs" / "quickstart.yaml"
    text = render_values(resolved_values(cfg, ["engine.block_size=64"]), str(cfg))
    shown = config_from_dict(yaml.safe_load(text), "shown", cfg.parent)
    original = load_config(cfg, ["engine.block_size=64"])
    want = config_to_dict(original)
    want["engine"].update(num_gpu_blocks=resolve(original).num_gpu_blocks,
                          max_model_len=resolve(original).max_model_len)
    assert config_to_dict(shown) == want


def test_config_show_refuses_a_sweep_file_in_one_line(capsys) -> None:
    from sim.cli.main import main

    assert main(["config", "show", str(ROOT / "configs" / "sweeps" / "smoke.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a sweep file (it has base, grid)" in err[0] and "base_config" in err[0]


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_a_shown_apcsim_command_is_a_bash_block_that_runs_or_a_text_block(page: Path) -> None:
    """``bash`` blocks starting with ``apcsim`` run in tests/test_docs_examples.py; a command that cannot run
    as shown (the user's own files) goes in a ``text`` block, never in an unlabelled one."""
    unlabelled = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", page.read_text(), re.S | re.M):
        lines = [ln.strip() for ln in m.group(2).splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if lines and lines[0].startswith("apcsim ") and m.group(1) not in ("bash", "text"):
            unlabelled.append(lines[0][:60])
    assert unlabelled == []
