"""The timing side-channel experiment: what each salt policy hides from an attacker who
sees only the TTFT of its own ordinary requests."""

import copy
import math

import numpy as np
import pandas as pd
import pytest

from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.run import replay_experiment
from sim.experiment.sidechannel.parties import PREFIX, build_parties
from sim.experiment.sidechannel.point import replayed_requests, run_point
from workloads.tenants import TenantModel, apply_salt_policy
from workloads.trace_format import TraceRequest, write_trace

# A light chat background (a few sessions a minute) and the presence attack only: each test
# point replays in well under a second.
BASE = {
    "name": "sc_test",
    "seed": 3,
    "model": "llama-3-8b",
    "gpu": "H100-SXM",
    "engine": {"block_size": 16, "kv_cache_gib": 4, "max_model_len": 8192},
    "latency": {"kind": "roofline", "noise": {"kind": "lognormal"}},
    "workload": {
        "kind": "chat", "sessions": 100000, "turns": {"dist": "geometric", "mean": 3, "max": 8},
        "system_prompt_tokens": 400, "system_prompts": 4,
        "user_tokens": {"dist": "lognormal", "median": 60, "sigma": 1.0, "min": 1, "max": 512},
        "output_tokens": {"dist": "lognormal", "median": 32, "sigma": 0.8, "min": 1, "max": 256},
        "think_time": {"dist": "exponential", "mean": 10}, "max_context_tokens": 4096,
        "arrival": {"kind": "poisson", "rate": 0.1},
        "tenants": {"num_tenants": 4, "users_per_tenant": 4, "salt": "none"},
    },
    "sidechannel": {
        "warmup_s": 5,
        "presence": {"victim_requests": 100, "victim_rate": 0.5, "secret_tokens": 1024, "window_s": 2.0},
        "reconstruction": {"enabled": False},
        "capacity": {"enabled": False},
    },
}


def _cfg(**sets):
    data = copy.deepcopy(BASE)
    for key, value in sets.items():
        node = data
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return config_from_dict(data, "test.yaml")


def _run(**sets):
    cfg = _cfg(**sets)
    return run_point(cfg, resolve(cfg))


def test_presence_no_salt_light_load_default_noise_auc_at_least_095():
    res = _run()
    m = res.metrics
    assert m["salt_policy"] == "none" and m["presence_n_pos"] == m["presence_n_neg"] == 100
    assert m["presence_auc"] >= 0.95, m
    assert m["presence_ttft_pos_median_s"] < m["presence_ttft_neg_median_s"]
    assert m["probes_after_cut"] == 0
    assert m["engine_busy_fraction"] < 0.5  # light load


def test_presence_other_salt_domain_is_chance():
    res = _run(workload__tenants__salt="per_tenant", sidechannel__presence__victim_requests=300)
    m = res.metrics
    assert abs(m["presence_auc"] - 0.5) <= 0.05, m
    assert m["presence_auc_ci_low"] <= 0.5 <= m["presence_auc_ci_high"], m
    p = res.probes[res.probes["attack"] == "presence"]
    hit_tokens = p.groupby("label")["hit_tokens"].max()
    assert hit_tokens[1] == hit_tokens[0]  # the secret is never hit from the other domain


@pytest.mark.parametrize("policy", ["per_tenant", "per_user", "per_session", "shared_system_prompt"])
def test_presence_leak_persists_in_the_victims_domain(policy):
    m = _run(workload__tenants__salt=policy, sidechannel__attacker__domain="same").metrics
    assert m["presence_auc"] >= 0.95, (policy, m)
    assert m["presence_auc_ci_low"] > 0.5


def test_shared_system_prompt_hides_documents_but_shares_a_secret_system_prompt():
    """The tenant tag follows the system prompt: another tenant cannot see the victim's documents,
    but a secret inside the system prompt is shared with every tenant, so it leaks across them."""
    doc = _run(workload__tenants__salt="shared_system_prompt").metrics
    assert doc["presence_auc_ci_low"] <= 0.5 <= doc["presence_auc_ci_high"], doc
    prompt = _run(workload__tenants__salt="shared_system_prompt", sidechannel__victim__secret_in="system_prompt")
    assert prompt.metrics["presence_auc"] >= 0.95, prompt.metrics
    tenants = {r.tenant for r in replayed_requests(*_cfg_engine(workload__tenants__salt="shared_system_prompt"))
               if r.id.startswith(PREFIX)}
    assert tenants == {"t4", "t5"}  # two tenants, and still the leak
    isolated = _run(workload__tenants__salt="per_tenant", sidechannel__victim__secret_in="system_prompt").metrics
    assert isolated["presence_auc_ci_low"] <= 0.5 <= isolated["presence_auc_ci_high"]


def _cfg_engine(**sets):
    cfg = _cfg(**sets)
    return cfg, resolve(cfg)


def test_per_request_salt_leaks_nothing_even_in_the_victims_domain():
    m = _run(workload__tenants__salt="per_request", sidechannel__attacker__domain="same").metrics
    assert m["presence_auc_ci_low"] <= 0.5 <= m["presence_auc_ci_high"], m
    assert m["background_hit_rate"] == 0.0 and m["victim_hit_rate"] == 0.0


def test_policy_cost_is_measured_on_the_background_alone():
    same = _run(workload__tenants__salt="per_tenant", sidechannel__attacker__domain="same").metrics
    other = _run(workload__tenants__salt="per_tenant").metrics
    assert same["background_alone_hit_rate"] == other["background_alone_hit_rate"]  # the attacker plays no part
    assert same["background_hit_rate"] != other["background_hit_rate"]  # (with it, its probes churn the pool)
    none = _run().metrics
    assert none["background_alone_hit_rate"] > same["background_alone_hit_rate"] > 0.0


def test_same_seed_same_result_other_seed_other_result():
    a, b = _run(), _run()
    pd.testing.assert_frame_equal(a.probes, b.probes)
    assert a.metrics == b.metrics
    c = _run(sidechannel__seed=11)
    assert not np.array_equal(a.probes["arrival"].to_numpy(), c.probes["arrival"].to_numpy())


def test_probes_are_ordinary_requests(tmp_path):
    """Replaying the very stream of a side-channel point as a plain trace through the normal
    replay gives every request the same first token, TTFT and hit tokens: the engine is the
    ordinary one and nothing distinguishes a probe."""
    cfg = _cfg(sidechannel__presence__victim_requests=20, workload__tenants__salt="shared_system_prompt")
    engine = resolve(cfg)
    res = run_point(cfg, engine)
    stream = replayed_requests(cfg, engine, res.metrics["cut_s"])
    assert sum(r.id.startswith(PREFIX) for r in stream) == 60  # 20 victim requests + 40 probes
    path = tmp_path / "stream.jsonl"
    write_trace(path, stream)
    data = copy.deepcopy(BASE)
    data.pop("sidechannel")
    data["workload"] = {"kind": "trace", "path": str(path)}
    plain, _ = replay_experiment(config_from_dict(data, "plain.yaml"), progress=False)
    cols = ["request_id", "arrival", "first_token", "ttft", "hit_tokens", "prompt_tokens"]
    point = res.replay.requests[cols].reset_index(drop=True)
    origin = min(r.arrival for r in stream)  # a trace replays its arrivals relative to the first one
    point["arrival"] -= origin
    point["first_token"] -= origin
    pd.testing.assert_frame_equal(plain.requests[cols].reset_index(drop=True), point)


def test_a_probe_answered_after_the_cut_extends_the_cut():
    """With no tail the last probe is answered after the first cut (its own arrival): the point is
    replayed with more background until every probe's first token comes before the cut (then its
    TTFT is the full replay's, which a replay with a long tail confirms)."""
    res = _run(sidechannel__presence__victim_requests=10, sidechannel__tail_s=0.0)
    m = res.metrics
    assert m["probes_after_cut"] == 0
    assert m["cut_s"] > res.probes["arrival"].max()  # it had to move
    assert res.probes["first_token"].max() <= m["cut_s"]
    long_tail = _run(sidechannel__presence__victim_requests=10, sidechannel__tail_s=30.0)
    pd.testing.assert_series_equal(res.probes["ttft"], long_tail.probes["ttft"])


def test_reconstruction_recovers_blocks_without_noise_and_not_with_it():
    sets = {"sidechannel__presence__enabled": False, "sidechannel__reconstruction__enabled": True,
            "sidechannel__reconstruction__trials": 6, "engine__block_size": 256}
    clean = _run(latency__noise=None, sidechannel__network=0, **sets).metrics
    assert clean["recon_probes_per_block"] == 4 and clean["recon_trials"] == 6
    assert clean["recon_block_accuracy"] >= 0.9, clean
    assert clean["recon_success_n1"] >= clean["recon_success_n2"] >= clean["recon_success_n4"]
    other = _run(latency__noise=None, sidechannel__network=0, workload__tenants__salt="per_tenant", **sets).metrics
    assert other["recon_success_n4"] < clean["recon_success_n4"]
    noisy = _run(**sets).metrics  # default step noise + network delay: one 256-token block is ~1 ms
    assert noisy["recon_success_n4"] < clean["recon_success_n4"]


def test_capacity_prime_probe_sees_the_victim_across_salt_domains():
    sets = {"sidechannel__presence__enabled": False, "sidechannel__capacity__enabled": True,
            "sidechannel__capacity__trials": 20, "workload__tenants__salt": "per_tenant"}
    m = _run(**sets).metrics
    assert m["capacity_n_pos"] == m["capacity_n_neg"] == 10
    assert m["capacity_auc"] >= 0.9, m  # salt hides content, not load
    assert m["capacity_ttft_pos_median_s"] > m["capacity_ttft_neg_median_s"]


def test_salts_of_the_parties_follow_the_policy():
    cfg = _cfg()
    sc = cfg.sidechannel

    def salts(policy, domain):
        plan = build_parties(sc.model_copy(update={"attacker": sc.attacker.model_copy(update={"domain": domain})}),
                             policy, block_size=16, capacity_tokens=32768, num_background_tenants=4, seed=0)
        victim = {r.salt for r in plan.requests if "-victim-" in r.id}
        attacker = {r.salt for r in plan.requests if "-probe-" in r.id}
        return victim, attacker, plan

    for policy in ("per_tenant", "per_user", "per_session"):
        v, a, _ = salts(policy, "same")
        assert len(v) == 1 and v == a, policy
        v, a, _ = salts(policy, "other")
        assert len(v) == 1 and not v & a, policy
    v, a, _ = salts("per_tenant", "same_tenant")
    assert v == a == {"t4"}
    v, a, _ = salts("per_user", "same_tenant")
    assert v == {"t4/u0"} and a == {"t4/u1"}
    v, a, plan = salts("per_request", "same")
    assert len(v | a) == len([r for r in plan.requests if "-victim-" in r.id or "-probe-" in r.id])
    v, a, plan = salts("shared_system_prompt", "other")
    assert v == a == {None}
    tags = {r.tenant for r in plan.requests}
    assert tags == {"t4", "t5"}  # the victim is the first tenant after the background's four


def test_apply_salt_policy_is_what_the_tenant_model_does():
    for policy in ("none", "per_tenant", "per_user", "per_session", "per_request", "shared_system_prompt"):
        model = TenantModel(num_tenants=3, users_per_tenant=2, salt=policy, seed=5)
        for s in range(6):
            a = TraceRequest(f"r{s}", 0.0, np.arange(40, dtype=np.int64), 1, session=f"s{s}", system_tokens=8)
            b = copy.copy(a)
            model.apply(a)
            t, u = model.assign(f"s{s}")
            apply_salt_policy(b, policy, t, u, f"s{s}")
            assert (a.salt, a.tenant, len(a.tokens)) == (b.salt, b.tenant, len(b.tokens)), policy


def test_plan_shape():
    cfg = _cfg(sidechannel__reconstruction__enabled=True, sidechannel__capacity__enabled=True,
               sidechannel__presence__victim_requests=30)
    sc = cfg.sidechannel
    plan = build_parties(sc, "none", block_size=16, capacity_tokens=32768, num_background_tenants=4, seed=0)
    ids = [r.id for r in plan.requests]
    assert len(set(ids)) == len(ids) and all(i.startswith(PREFIX) for i in ids)
    arrivals = [r.arrival for r in plan.requests]
    assert arrivals == sorted(arrivals)
    kinds = pd.Series([p.attack for p in plan.probes]).value_counts()
    r = sc.reconstruction
    assert kinds["presence"] == 60 and kinds["reconstruction"] == r.trials * r.blocks * r.candidates
    assert kinds["capacity"] == sc.capacity.trials
    assert sum(p.label for p in plan.probes if p.attack == "capacity") == sc.capacity.trials // 2
    assert plan.prime_requests == math.ceil(0.8 * 32768 / 2048)
    presence = sorted(r.arrival for r in plan.requests if "presence-probe" in r.id)
    assert min(np.diff(presence)) >= sc.presence.probe_spacing_s - 1e-9  # one probe at a time
    starts = [plan.phases[k][0] for k in ("presence", "reconstruction", "capacity")]
    assert starts == sorted(starts) and starts[0] == sc.warmup_s


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"test\.yaml: sidechannel\.presence\.victm_requests: unknown key"):
        _cfg(sidechannel__presence__victm_requests=3)
    with pytest.raises(ConfigError, match=r"sidechannel\.presence: min_lag_s must be <= window_s"):
        _cfg(sidechannel__presence__min_lag_s=5.0)
    with pytest.raises(ConfigError, match=r"sidechannel\.attacker\.domain"):
        _cfg(sidechannel__attacker__domain="neighbour")
    with pytest.raises(ConfigError, match=r"sidechannel: enable at least one attack"):
        _cfg(sidechannel__presence__enabled=False)
    cfg = _cfg(sidechannel__presence__secret_tokens=9000)
    with pytest.raises(ConfigError, match=r"sidechannel: a party prompt of .* exceeds max_model_len"):
        run_point(cfg, resolve(cfg))


def test_background_that_ends_too_early_is_refused():
    cfg = _cfg(workload__sessions=3)
    with pytest.raises(ConfigError, match=r"workload: the background traffic ends at"):
        run_point(cfg, resolve(cfg))
