"""``apcsim calibrate`` and ``apcsim validate`` check every number on the command line before any
work (issue 37: every CLI number is validated): a count below its floor, a share outside [0, 1), a
budget that is not a positive finite number, or a word where a number belongs is one
``apcsim: error:`` line naming the argument, with exit code 2 and nothing written."""

from __future__ import annotations

import pytest

from sim.cli.main import main

CASES = [
    (["calibrate", "--out", "m.json", "--threads", "0"], "--threads: must be >= 1, got 0"),
    (["calibrate", "--out", "m.json", "--block-size", "-16"], "--block-size: must be >= 1, got -16"),
    (["calibrate", "--out", "m.json", "--repeats", "0"], "--repeats: must be >= 1, got 0"),
    (["calibrate", "--out", "m.json", "--warmup", "-1"], "--warmup: must be >= 0, got -1"),
    (["calibrate", "--out", "m.json", "--timing-repeats", "0"], "--timing-repeats: must be >= 1"),
    (["calibrate", "--out", "m.json", "--link-repeats", "abc"], "--link-repeats: expected a whole number, got 'abc'"),
    (["calibrate", "--out", "m.json", "--replay-retime-passes", "-2"], "--replay-retime-passes: must be >= 0"),
    (["calibrate", "--out", "m.json", "--holdout", "1"], "--holdout: must be >= 0 and < 1, got 1"),
    (["calibrate", "--out", "m.json", "--holdout", "-0.1"], "--holdout: must be >= 0 and < 1"),
    (["calibrate", "--out", "m.json", "--budget-s", "0"], "--budget-s: must be > 0, got 0"),
    (["calibrate", "--out", "m.json", "--budget-s", "nan"], "--budget-s: must be > 0, got nan"),
    (["calibrate", "--out", "m.json", "--replay-budget-s", "inf"], "--replay-budget-s: must be > 0, got inf"),
    (["validate", "c.yaml", "--real-runs", "0"], "--real-runs: must be >= 1, got 0"),
    (["validate", "c.yaml", "--warmup-steps", "-3"], "--warmup-steps: must be >= 0, got -3"),
    (["validate", "c.yaml", "--retime-passes", "1.5"], "--retime-passes: expected a whole number, got '1.5'"),
]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=[" ".join(a[3:] or a) for a, _ in CASES])
def test_a_bad_number_is_one_line_naming_its_argument(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("apcsim: error: ") and words in err[0], err
    assert not any(tmp_path.iterdir())  # nothing written


def test_good_numbers_still_parse() -> None:
    from sim.cli.main import build_parser

    args = build_parser().parse_args(["calibrate", "--out", "m.json", "--threads", "2", "--holdout", "0",
                                      "--budget-s", "1.5", "--warmup", "0", "--link-repeats", "3"])
    assert (args.threads, args.holdout, args.budget_s, args.warmup, args.link_repeats) == (2, 0.0, 1.5, 0, 3)
