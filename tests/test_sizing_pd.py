"""apcsim size on a disaggregated fleet (sim.experiment.sizing_pd): several SLOs at once, the
staircase search over prefill and decode counts, and the CLI on a real replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.experiment.config import ConfigError, ExperimentConfig, config_from_dict
from sim.experiment.sizing import SLO, parse_slos
from sim.experiment.sizing_pd import size_pools, with_pools

SLOS = (SLO("ttft_p90_s", 2.0), SLO("tpot_p90_s", 0.05))


def _cfg() -> ExperimentConfig:
    return config_from_dict({
        "name": "pd", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 40, "rate": 40.0, "prefix_tokens": 256,
                     "suffix_tokens": 64, "output_tokens": 16},
        "cluster": {"replicas": 2, "router": "dynamo",
                    "disaggregation": {"prefill": 1, "decode": 1, "link_gb_s": 25.0, "latency_s": 0.001}},
    })


def test_parse_slos_joins_with_commas() -> None:
    assert parse_slos("ttft_p90=2s,tpot_p90=50ms") == SLOS
    with pytest.raises(ConfigError, match="ttft_p90_s given twice"):
        parse_slos("ttft_p90=2s,ttft_p90=1s")
    with pytest.raises(ConfigError, match="expected METRIC=LIMIT"):
        parse_slos("ttft_p90=2s,tpot")


def test_with_pools_keeps_the_link_and_sets_both_counts() -> None:
    cfg = with_pools(_cfg(), 3, 5, {"kind": "llm_d", "prefix": "approximate"})
    assert cfg.cluster is not None and cfg.cluster.disaggregation is not None
    assert (cfg.cluster.replicas, cfg.cluster.disaggregation.prefill, cfg.cluster.disaggregation.decode) == (8, 3, 5)
    assert cfg.cluster.disaggregation.latency_s == 0.001 and cfg.cluster.router.kind == "llm_d"


def _model(ttft_need: float, tpot_need: float, cross: float = 0.0) -> Any:
    """A replay whose TTFT falls with prefill replicas (and, by ``cross``, decode ones) and whose
    TPOT falls with decode replicas: TTFT = ttft_need / (P + cross * D), TPOT = tpot_need / D."""
    calls: list[tuple[int, int]] = []

    def replay(cfg: ExperimentConfig) -> dict[str, Any]:
        pd = cfg.cluster.disaggregation  # type: ignore[union-attr]
        p, d = pd.prefill, pd.decode
        calls.append((p, d))
        return {"ttft_p90_s": 2.0 * ttft_need / (p + cross * d), "tpot_p90_s": 0.05 * tpot_need / d}

    replay.calls = calls  # type: ignore[attr-defined]
    return replay


def _brute(ttft_need: float, tpot_need: float, cross: float, cap: int) -> tuple[int, int] | None:
    ok = [(p + d, p, d) for p in range(1, cap + 1) for d in range(1, cap + 1)
          if 2.0 * ttft_need / (p + cross * d) <= 2.0 and 0.05 * tpot_need / d <= 0.05]
    return (min(ok)[1], min(ok)[2]) if ok else None


@pytest.mark.parametrize("ttft_need, tpot_need, cross", [
    (5, 3, 0.0), (1, 1, 0.0), (7, 2, 0.5), (3, 9, 0.25), (11, 1, 1.0), (2, 6, 2.0),
])
def test_staircase_finds_the_fewest_replicas(ttft_need: float, tpot_need: float, cross: float) -> None:
    """Against every pair up to the cap: the fewest replicas in all meeting both SLOs (ties: fewer
    prefill), with each pair replayed once."""
    replay = _model(ttft_need, tpot_need, cross)
    s = size_pools(_cfg(), "dynamo", SLOS, max_replicas=16, replay=replay)
    assert (s.prefill, s.decode) == _brute(ttft_need, tpot_need, cross, 16)
    assert len(replay.calls) == len(set(replay.calls)) == len(s.probes)


def test_unmet_within_the_cap_is_none() -> None:
    s = size_pools(_cfg(), "dynamo", SLOS, max_replicas=4, replay=_model(9, 1))
    assert s.replicas is None and s.prefill is None
    assert max(p["prefill"] for p in s.probes) == 4


def test_size_cli_disaggregated_real_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli.main import main

    p = tmp_path / "c.yaml"
    p.write_text(json.dumps({
        "name": "szpd", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 60, "rate": 200.0, "prefix_tokens": 512,
                     "suffix_tokens": 512, "output_tokens": 64},
        "cluster": {"replicas": 2, "router": "round_robin",
                    "disaggregation": {"prefill": 1, "decode": 1, "link_gb_s": 50.0}},
    }))
    assert main(["size", str(p), "--slo", "ttft_p90=0.15s,tpot_p90=20ms", "--max-replicas", "8",
                 "--out", str(tmp_path / "out")]) == 0
    out = json.loads((tmp_path / "out" / "sizing.json").read_text())
    assert [s["metric"] for s in out["slos"]] == ["ttft_p90_s", "tpot_p90_s"]
    (row,) = out["routers"]
    assert row["prefill"] is not None and row["replicas"] == row["prefill"] + row["decode"]
    met = {(q["prefill"], q["decode"]): q["met"] for q in row["probes"]}
    assert met[row["prefill"], row["decode"]]
    assert all(q["ttft_p90_s"] <= 0.15 and q["tpot_p90_s"] <= 0.02 for q in row["probes"] if q["met"])
    # no probed pair with fewer replicas in all met both SLOs
    assert not any(v and p + d < row["replicas"] for (p, d), v in met.items())
    assert "smallest prefill + decode count" in capsys.readouterr().out
