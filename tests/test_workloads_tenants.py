"""Tenants, users, every salt policy, LoRA and prompt logprobs, checked through the hit bound."""

import collections

import numpy as np
import pytest

from sim.core.request import token_array
from workloads.bounds import HitBound, infinite_cache_hit_bound
from workloads.tenants import SALT_POLICIES, TenantModel, keyed_uniform
from workloads.tokens import TENANT_TAG_BASE, RunTokens
from workloads.trace_format import TraceRequest

SYS = 64  # a 64-token system prompt shared by every request


def _workload():
    """3 sessions x 3 turns; each turn extends the previous prompt; all share the system prompt."""
    reqs = []
    for s in range(6):
        hist = RunTokens.of((1 << 40, SYS))
        for k in range(3):
            hist = RunTokens.of(hist, ((s + 2) << 40 | k << 20, 48))
            reqs.append(TraceRequest(f"s{s}-{k}", float(len(reqs)), hist, 1, session=f"s{s}", system_tokens=SYS))
    return reqs


def _bound(policy, **kw):
    model = TenantModel(num_tenants=2, users_per_tenant=2, salt=policy, seed=1, **kw)
    return infinite_cache_hit_bound(model.decorate(_workload()), 16)


def test_assignment_is_per_session_and_deterministic():
    model = TenantModel(num_tenants=5, users_per_tenant=3, seed=4)
    reqs = list(model.decorate(_workload()))
    by_session = collections.defaultdict(set)
    for r in reqs:
        by_session[r.session].add(r.tenant)
    assert all(len(v) == 1 for v in by_session.values())
    again = list(TenantModel(num_tenants=5, users_per_tenant=3, seed=4).decorate(_workload()))
    assert [r.tenant for r in reqs] == [r.tenant for r in again]
    assert model.assign("x") == model.assign("x")
    assert 0.0 <= keyed_uniform(1, "a", "b") < 1.0


def test_tenant_skew():
    model = TenantModel(num_tenants=4, tenant_skew=1.5, seed=0)
    counts = collections.Counter(model.assign(f"s{i}")[0] for i in range(4000))
    assert counts[0] > counts[1] > counts[2] > counts[3] > 0
    uniform = collections.Counter(TenantModel(num_tenants=4).assign(f"s{i}")[0] for i in range(4000))
    assert max(uniform.values()) < 1.2 * min(uniform.values())


def test_salt_values():
    reqs = list(TenantModel(num_tenants=2, users_per_tenant=3, salt="per_user", seed=2).decorate(_workload()))
    assert all(r.salt == f"{r.tenant}/u{TenantModel(2, 0, 3, 0, seed=2).assign(r.session)[1]}" for r in reqs)
    reqs = list(TenantModel(salt="per_session").decorate(_workload()))
    assert {r.salt for r in reqs} == {f"session:s{s}" for s in range(6)}
    reqs = list(TenantModel(salt="per_request").decorate(_workload()))
    assert len({r.salt for r in reqs}) == len(reqs)
    with pytest.raises(ValueError):
        TenantModel(salt="bogus")  # type: ignore[arg-type]


def test_policies_order_the_bound():
    b = {p: _bound(p) for p in SALT_POLICIES}
    plain = infinite_cache_hit_bound(_workload(), 16)
    assert b["none"] == pytest.approx(plain) and plain > 0
    assert b["per_request"] == 0.0  # nothing is ever shared
    # per_session keeps exactly the within-session hits: turn k>0 hits all of turn k-1's blocks
    assert b["per_session"] > 0
    assert b["per_request"] < b["per_session"] <= b["per_user"] <= b["per_tenant"] <= b["none"]
    # shared_system_prompt: cross-tenant system-prompt hits come back on top of per_tenant
    assert b["per_tenant"] < b["shared_system_prompt"] <= b["none"]


def test_shared_system_prompt_shares_exactly_the_system_blocks():
    model = TenantModel(num_tenants=2, salt="shared_system_prompt", seed=1)
    reqs = list(model.decorate(_workload()))
    tenants = {r.tenant for r in reqs}
    assert len(tenants) == 2
    firsts = [r for r in reqs if r.id.endswith("-0")]
    for r in reqs:
        toks = token_array(r.tokens)
        assert r.salt is None and toks[SYS] == TENANT_TAG_BASE + int(r.tenant[1:])
    # A first turn of a session whose tenant already appeared hits its own tenant's first turn
    # only up to the system prompt (content differs), and one of the other tenant only up to it too.
    bound = HitBound(16)
    hits = [bound.add(r) for r in reqs]
    by_id = dict(zip([r.id for r in reqs], hits))
    assert all(by_id[r.id] <= SYS for r in firsts) and max(by_id[r.id] for r in firsts[1:]) == SYS
    # a salt on block 0 cannot do this: per_tenant first turns of different tenants share nothing
    salted = list(TenantModel(num_tenants=2, salt="per_tenant", seed=1).decorate(_workload()))
    b2 = HitBound(16)
    seen_tenants = set()
    for r in salted:
        h = b2.add(r)
        if r.id.endswith("-0") and r.tenant not in seen_tenants:
            assert h == 0
        seen_tenants.add(r.tenant)


def test_lora_and_prompt_logprobs():
    model = TenantModel(num_tenants=4, lora_adapters=2, prompt_logprobs_fraction=0.5, seed=3)
    reqs = list(model.decorate(_workload()))
    assert {r.lora for r in reqs} <= {"lora-0", "lora-1"}
    assert all(r.lora == f"lora-{int(r.tenant[1:]) % 2}" for r in reqs)
    assert 0 < sum(r.prompt_logprobs for r in reqs) < len(reqs)
    # LoRA separates tenants on different adapters; prompt-logprobs requests never hit
    assert _bound("none", lora_adapters=2) <= _bound("none")
    bound = HitBound(16)
    for r in list(TenantModel(prompt_logprobs_fraction=1.0).decorate(_workload())):
        assert bound.add(r) == 0
    many = [TraceRequest(f"x{i}", 0.0, np.zeros(4, np.int64), 1) for i in range(4000)]
    share = np.mean([r.prompt_logprobs for r in TenantModel(prompt_logprobs_fraction=0.1).decorate(many)])
    assert 0.08 < share < 0.12


def test_no_tenants_section_leaves_requests_alone():
    r = TraceRequest("a", 0.0, np.arange(4, dtype=np.int64), 1, salt="keep", lora="l")
    out = TenantModel(salt="per_tenant").apply(r)
    assert out.salt == "keep" and out.lora == "l"  # the source's own salt wins; lora_adapters=0 keeps its adapter
    r = TraceRequest("a", 0.0, np.arange(4, dtype=np.int64), 1, salt="keep", lora="l")
    assert TenantModel(salt="per_tenant", assign_by="random").apply(r).salt == "t0"  # drawn, labels ignored


def test_bound_extra_keys_have_vllm_equality_structure():
    """The bound's keys (sim.core.hashing.blocks_extra_keys, the engine's own) give per-request
    hits equal to a reference that keys every block as vLLM does, written out here (LoRA on every
    block, salt on block 0), corner cases included."""
    from sim.core.hashing import FastBlockHasher

    def reference(reqs, bs=4):
        h, seen, out = FastBlockHasher(bs), set(), []
        for r in reqs:
            toks = token_array(r.tokens)
            n = toks.size // bs
            extras = [((r.lora,) if r.lora else ()) + ((r.salt,) if r.salt and i == 0 else ()) or None
                      for i in range(n)]
            keys = h.hash_token_blocks(toks, extras)
            k = 0
            for key in keys[: (toks.size - 1) // bs]:
                if key not in seen:
                    break
                k += 1
            out.append(k * bs)
            seen.update(keys)
        return out

    toks = np.arange(17, dtype=np.int64)
    combos = [(None, None), ("x", None), (None, "x"), ("x", "x"), ("y", None), ("x", None), (None, "x"),
              ("x", "y"), ("y", "x"), ("x", "x"), (None, None)]
    reqs = [TraceRequest(f"r{i}", 0.0, toks, 1, lora=lo, salt=sa) for i, (lo, sa) in enumerate(combos)]
    bound = HitBound(4, include_outputs=False)
    # index 2: vLLM keys a LoRA "x" and a salt "x" alike on block 0 (one shared block)
    assert [bound.add(r) for r in reqs] == reference(reqs) == [0, 0, 4, 0, 0, 16, 16, 0, 0, 16, 16]
