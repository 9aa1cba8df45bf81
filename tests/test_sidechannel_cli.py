"""``apcsim sidechannel``: a small study end to end -- sweep machinery, table, figures, resume."""

import copy
import json

import pandas as pd
import pytest
import yaml
from test_sidechannel import BASE

from sim.analysis.sidechannel_data import SideChannelData
from sim.analysis.sidechannel_table import auc_by_load, headline
from sim.cli.main import main
from sim.experiment.config import ConfigError
from sim.experiment.sidechannel_study import load_study

SMALL = copy.deepcopy(BASE)
SMALL["workload"]["arrival"]["rate"] = 1.0  # sessions per second: some background even in a short study
SMALL["sidechannel"] = {
    "warmup_s": 5,
    "presence": {"victim_requests": 20, "victim_rate": 1.0, "secret_tokens": 1024, "window_s": 1.0},
    "reconstruction": {"trials": 2, "blocks": 2, "candidates": 3},
    "capacity": {"trials": 4, "prime_fraction": 0.5},
}


def _study(tmp_path, **extra):
    study = {"name": "sc_small", "output_dir": str(tmp_path / "out"), "bounds": False, "base": SMALL,
             "grid": {"workload.tenants.salt": ["none", "per_tenant"], "sidechannel.attacker.domain": ["same", "other"],
                      "workload.arrival.rate_scale": [0.5, 1.0]}, **extra}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_study_end_to_end(tmp_path, capsys):
    path = _study(tmp_path)
    assert main(["sidechannel", str(path), "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "out" / "sc_small"
    assert "sidechannel sc_small: 8 points" in out and "| per_tenant | other |" in out
    for name in ("table.parquet", "table.csv", "headline.md", "headline.csv", "meta.json", "sweep.yaml",
                 "sidechannel_roc.png", "sidechannel_auc_vs_load.svg", "sidechannel_tradeoff.png"):
        assert (folder / name).is_file(), name
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["points"] == 8 and "git_commit" in meta and meta["versions"]["numpy"]
    table = pd.read_parquet(folder / "table.parquet")
    assert (table["status"] == "ok").all() and len(table) == 8
    point = folder / "points" / table["key"].iloc[0]
    assert (point / "probes.parquet").is_file() and not (point / "requests.parquet").exists()
    probes = pd.read_parquet(point / "probes.parquet")
    assert set(probes["attack"]) == {"presence", "reconstruction", "capacity"}

    d = SideChannelData(folder)
    head = headline(d)
    assert list(head["salt policy"]) == ["none", "none", "per_tenant", "per_tenant"]
    row = d.reference()
    row = row[(row["salt_policy"] == "per_tenant") & (row["attacker_domain"] == "other")].iloc[0]
    cell = head[(head["salt policy"] == "per_tenant") & (head["attacker"] == "other")]["presence AUC [95% CI]"].iloc[0]
    assert cell.startswith(f"{row['presence_auc']:.3f} [")
    assert float(row["workload.arrival.rate_scale"]) == 0.5  # the reference: the first listed load
    lost = head[(head["salt policy"] == "per_tenant") & (head["attacker"] == "same")]["hit rate lost"].iloc[0]
    base = d.reference()
    same = base[base["attacker_domain"] == "same"].set_index("salt_policy")["background_alone_hit_rate"]
    assert float(lost) == pytest.approx(same["none"] - same["per_tenant"], abs=1e-3)
    by_load = auc_by_load(d, "presence")
    assert list(by_load.columns) == ["salt policy", "attacker", "load x0.5", "load x1"]

    assert main(["sidechannel", str(path), "--workers", "1", "--no-progress", "--no-plots"]) == 0
    assert "ran 0, skipped 8" in capsys.readouterr().out


def test_one_experiment_file_is_a_one_point_study(tmp_path, capsys):
    data = copy.deepcopy(SMALL)
    data.update(name="one_point", output_dir=str(tmp_path / "res"))
    data["sidechannel"]["reconstruction"] = {"enabled": False}
    data["sidechannel"]["capacity"] = {"enabled": False}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["sidechannel", str(path), "--workers", "1", "--no-progress", "--no-plots"]) == 0
    assert (tmp_path / "res" / "one_point" / "headline.md").is_file()
    assert "| none | other |" in capsys.readouterr().out


def test_points_without_a_sidechannel_section_are_refused(tmp_path, capsys):
    base = copy.deepcopy(SMALL)
    base.pop("sidechannel")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "base": base, "grid": {"seed": [0, 1]}}))
    with pytest.raises(ConfigError, match=r"sidechannel: required in every point"):
        load_study(path)
    assert main(["sidechannel", str(path)]) == 2
    exp = tmp_path / "e.yaml"
    exp.write_text(yaml.safe_dump(SMALL))
    assert main(["run", str(exp)]) == 2
    assert "sidechannel: a side-channel experiment runs with apcsim sidechannel" in capsys.readouterr().err


def test_shipped_study_configs_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs"
    head = load_study(root / "sidechannel.yaml")
    assert len(head.points) == 6 * 2 * 2
    with_load = load_study(root / "sweeps" / "sidechannel_load.yaml")
    assert len(with_load.points) == 6 * 2 * 3
    assert {p.key for p in head.points} < {p.key for p in with_load.points}  # the same points, plus x16
    assert {p.config.workload.tenants.salt for p in head.points} == {
        "none", "shared_system_prompt", "per_tenant", "per_user", "per_session", "per_request"}
    full = load_study(root / "sweeps" / "sidechannel_full.yaml")
    assert len(full.points) == 6 * 2 * 2 * 2 * 2
    assert {p.config.latency.noise is None for p in full.points} == {True, False}


def test_tables_and_figures_hold_only_the_settings_a_study_has(tmp_path):
    """Zipped axes (noise with network) give two settings, not their product."""
    rows = []
    for i, (policy, domain, bs, noise) in enumerate(
            (p, d, b, n) for p in ("none", "per_tenant") for d in ("same", "other") for b in (16, 256)
            for n in ("default", "none")):
        rows.append({"point": i, "workload.tenants.salt": policy, "sidechannel.attacker.domain": domain,
                     "engine.block_size": bs, "latency.noise": noise, "sidechannel.network": noise + "_net",
                     "salt_policy": policy, "attacker_domain": domain, "status": "ok", "key": f"k{i}",
                     "presence_auc": 0.5 if (policy, domain) == ("per_tenant", "other") else 0.99,
                     "presence_auc_ci_low": 0.4, "presence_auc_ci_high": 1.0, "recon_success_n4": bs / 256,
                     "background_alone_hit_rate": 0.8 if policy == "none" else 0.7})
    folder = tmp_path / "study"
    folder.mkdir()
    pd.DataFrame(rows).to_parquet(folder / "table.parquet")
    axes = [{"key": "workload.tenants.salt", "labels": ["none", "per_tenant"]},
            {"key": "sidechannel.attacker.domain", "labels": ["same", "other"]},
            {"key": "engine.block_size", "labels": [16, 256]},
            {"key": "latency.noise", "labels": ["default", "none"]},
            {"key": "sidechannel.network", "labels": ["default_net", "none_net"]}]
    (folder / "sweep.json").write_text(json.dumps({"name": "fake", "axes": axes}))
    from sim.analysis.sidechannel_figures import _settings
    from sim.analysis.sidechannel_table import by_setting

    d = SideChannelData(folder)
    assert len(_settings(d)) == 4
    table = by_setting(d)
    assert len(table.columns) == 2 + 4
    cell = table[(table["salt policy"] == "per_tenant") & (table["attacker"] == "other")][
        "block_size=256, noise=none, network=none_net"].iloc[0]
    assert cell == "0.500 / 1.00"
    head = headline(d)
    assert list(head["hit rate lost"]) == ["0.000", "0.000", "0.100", "0.100"]
    assert len(head) == 4  # one row per (policy, domain) at block 16, default noise
