"""A property over ``apcsim``'s argument vectors (issue 37): random sub-commands, flags, numbers
and paths never end in a traceback -- only exit code 0, or exit code 2 with exactly one
``apcsim: error:`` line on stderr.

Bounded to stay fast: ``APCSIM_CLI_FUZZ_EXAMPLES`` examples (default 40, what CI runs),
derandomized (the same vectors every run), every path inside one temporary folder that is also
the working directory (default output folders land there too), the only valid config a 6-request
replay. The torch commands (calibrate, validate) are left out: they import torch.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli.main import main

EXAMPLES = int(os.environ.get("APCSIM_CLI_FUZZ_EXAMPLES", "40"))
_TMP = Path(tempfile.mkdtemp(prefix="apcsim-cli-fuzz-"))
atexit.register(shutil.rmtree, _TMP, True)

_CONFIG = {
    "name": "fz", "output_dir": str(_TMP / "results"),
    "engine": {"block_size": 16, "num_gpu_blocks": 300, "max_model_len": 2048},
    "latency": {"kind": "fixed", "step_time_s": 0.01},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 6, "prefix_tokens": 32, "suffix_tokens": 16,
                 "output_tokens": 2, "rate": 50.0},
}
(_TMP / "ok.yaml").write_text(yaml.safe_dump(_CONFIG))
(_TMP / "bad.yaml").write_text("name: [unclosed\n")
(_TMP / "text.txt").write_text("not yaml: : :\n\x00")
(_TMP / "a_folder").mkdir()
(_TMP / "a_folder" / "summary.json").mkdir()

PATHS = st.sampled_from([  # the valid config four times: most vectors should reach the command itself
    *[str(_TMP / "ok.yaml")] * 4, str(_TMP / "bad.yaml"), str(_TMP / "text.txt"), str(_TMP / "a_folder"),
    str(_TMP / "missing.yaml"), str(_TMP / "a_folder" / "summary.json"), "/dev/null", "", "-", "ok.yaml",
])
OUTS = st.sampled_from([str(_TMP / "out"), str(_TMP / "text.txt"), str(_TMP / "a_folder"), str(_TMP / "o" / "p"),
                        "/dev/null", "/proc/nope"])
NUMBERS = st.one_of(st.integers(-10, 12).map(str), st.sampled_from(["0", "-1", "1e9", "abc", "", "2**64",
                                                                      "99999999999999999999", "nan", "3.5"]))
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
SETS = st.one_of(
    st.sampled_from(["engine.block_size=32", "engine.num_gpu_blocks=8", "engine.=5", "=", "x", "workload.kind=nope",
                     "engine.block_size=[1", "cluster.replicas=3", "engine.kv_cache_gib=-1", "name=../../x"]),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["engine.block_size", "seed", "workload.num_requests",
                                                         "replay.tables"]), TEXT),
)
FLAGS = st.one_of(
    st.tuples(st.just("--set"), SETS),
    st.tuples(st.just("--out"), OUTS),
    st.tuples(st.sampled_from(["--max-replicas", "--workers", "--block-size", "--top", "--request"]), NUMBERS),
    st.tuples(st.just("--slo"), st.sampled_from(["ttft_p99=2s", "e2e_p90<=500ms", "nope", "ttft_p99=-1s", ""])),
    st.tuples(st.just("--routers"), st.sampled_from(["round_robin", "nope", ",", "random,random", "llm_d:x"])),
    st.tuples(st.sampled_from(["--backend", "--device"]), st.sampled_from(["sim", "torch", "cuda", "x"])),
    st.sampled_from([("--json",), ("--no-progress",), ("--no-bounds",), ("--no-resume",), ("--no-plots",),
                     ("--csv",), ("--bogus",), ("-h",)]),
    st.tuples(TEXT),
)
COMMANDS = st.sampled_from([["run"], ["size"], ["sweep"], ["plot"], ["workloads", "stats"], ["explain"],
                            ["sidechannel"], ["config", "show"], ["nope"], []])


@st.composite
def argv(draw: st.DrawFn) -> list[str]:
    words = list(draw(COMMANDS))
    if draw(st.integers(0, 3)):
        words.append(draw(PATHS))
    if words[:1] == ["size"] and draw(st.booleans()):
        words += ["--slo", "ttft_p99=2s"]
    for flag in draw(st.lists(FLAGS, max_size=3)):
        words.extend(flag)
    if words[:1] not in (["run"], ["size"], ["sweep"], ["sidechannel"]) or "--no-progress" in words:
        return words
    return [*words, "--no-progress"]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("HYPOTHESIS_PROFILE") != "explore",
          database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(argv())
def test_any_argument_vector_ends_in_0_or_one_error_line(words: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(_TMP)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(words)
    finally:
        os.chdir(cwd)
    lines = [ln for ln in err.getvalue().splitlines() if "engine modules are not compiled" not in ln]
    assert "Traceback" not in err.getvalue(), (words, err.getvalue())
    assert rc in (0, 2), (words, rc, lines)
    if rc == 2:
        assert sum(ln.startswith("apcsim: error: ") for ln in lines) == 1 and lines[0].startswith("apcsim: error: "), (
            words, lines)
