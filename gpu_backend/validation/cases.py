"""Correctness scenarios: the real sim Scheduler + BlockPool drive a :class:`TorchExecutor`, and every
logit vector the executor computed is compared with a dense recompute of the whole sequence.

This is the point of APC: the next-token logits of a request served from cached blocks must equal
those of a full recompute without any cache. :class:`Harness` plays requests step by step (no
SimPy: ``schedule() -> execute() -> update_from_output()``, integrity and block-table checks after
every step) and records what happened (hits, preemptions, evictions, mixed steps), so each case can
also assert that its scenario really occurred. Cases (``CASES``):

* ``cold_prefill``: one request, no cache;
* ``prefix_hit``: a later request hits a finished request's blocks; two requests admitted in the
  *same* step share a prefix (the second hits blocks the first computes in that very forward pass);
* ``full_block_multiple``: a fully cached prompt of k full blocks hits k-1 of them;
* ``chunked_prefill_decode``: a long prompt in chunks, sharing steps with another request's decodes;
* ``preemption_eviction``: a request is preempted, some of its cached blocks are evicted, and it is
  re-admitted with a hit on the survivors;
* ``salts``: identical tokens under two cache salts -- no cross-salt reuse, equal logits;
* ``random_mix``: a seeded random workload on a small pool (everything at once);
* ``long_context`` (:mod:`gpu_backend.validation.cases_long`, separate for its cost): a 32k-token prompt in
  chunks, then a request that hits all of its 2,048 blocks and decodes over them;
* negative controls ``corrupt_shared_block`` and ``top_left_mask`` must make the comparison FAIL.

Shared by ``tests/test_gpu_backend_*.py`` (CPU, fp32) and ``gpu_backend/device/device_checks.py`` (the device run).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpu_backend.attention import Attention, ReferenceAttention, SplitAttention
from gpu_backend.executor.executor import TorchExecutor
from gpu_backend.executor.model import LlamaModel
from gpu_backend.layout.kv_cache import PagedKVCache
from sim.core.block_pool import BlockPool
from sim.core.config import CacheConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.scheduler_output import SchedulerOutput

FP32_TOL = 1e-5
BF16_KL_BOUND = 1e-2  # nats, per position: KL(dense || cached), both in bf16
BF16_MARGIN = 0.25  # top-1 must match wherever the dense top-2 logit margin exceeds this


@dataclass
class Admission:
    step: int
    request_id: str
    hit_tokens: int
    block_ids: list[int]
    resumed: bool  # re-admission after preemption


@dataclass
class CaseResult:
    name: str
    attention: str
    max_abs_diff: float = 0.0
    num_compared: int = 0
    max_kl: float = 0.0
    top1_mismatches: int = 0  # positions whose argmax differs and whose dense margin > BF16_MARGIN
    top1_flips_near_ties: int = 0  # argmax differs but the dense top-2 margin is below BF16_MARGIN
    facts: dict[str, Any] = field(default_factory=dict)
    per_request: dict[str, float] = field(default_factory=dict)

    def passes(self, dtype: torch.dtype) -> bool:
        if self.num_compared == 0:
            return False
        if dtype == torch.float32:
            return self.max_abs_diff <= FP32_TOL
        return self.max_kl <= BF16_KL_BOUND and self.top1_mismatches == 0

    def summary(self) -> str:
        return (f"{self.name:24s} {self.attention:38s} n={self.num_compared:3d} max|dlogit|={self.max_abs_diff:.2e} "
                f"maxKL={self.max_kl:.1e} top1_mismatch={self.top1_mismatches}")


class Harness:
    """A scheduler over a small pool, a paged cache of the same pool, and a logits-keeping executor."""

    def __init__(self, model: LlamaModel, attention: Attention | None = None, *, num_blocks: int = 64,
                 block_size: int = 16, fill: float = float("nan"), hash_algo: str = "sha256",
                 **sched_kwargs: Any) -> None:
        sched_kwargs.setdefault("max_model_len", 1024)
        sched_kwargs.setdefault("max_num_batched_tokens", 512)
        sched_kwargs.setdefault("max_num_seqs", 16)
        self.model = model
        self.scheduler = Scheduler(
            SchedulerConfig(**sched_kwargs),
            CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks),
            make_block_hasher(hash_algo, block_size, 0),
        )
        self.cache = PagedKVCache(model.spec.num_layers, num_blocks, block_size, model.num_kv_heads, model.head_dim,
                                  dtype=model.dtype, device=model.device, fill=fill)
        if attention is None:
            ref = ReferenceAttention()
            attention = SplitAttention(ref, ref)
        self.executor = TorchExecutor(model, self.cache, attention, verify_with=self.scheduler.kv_cache_manager,
                                      keep_logits=True)
        self.requests: dict[str, Request] = {}
        self.admissions: list[Admission] = []
        self.preempted: list[tuple[int, str]] = []
        self.mixed_steps = 0  # steps holding a decode and an unfinished prefill chunk
        self.partial_chunks: dict[str, int] = {}  # request id -> prefill chunks that did not end its prefill
        self.steps = 0
        self._uid = itertools.count(1)

    @property
    def pool(self) -> BlockPool:
        return self.scheduler.kv_cache_manager.block_pool

    def request(self, rid: str, prompt: Sequence[int] | np.ndarray, max_tokens: int, *, salt: str | None = None,
                outputs: Sequence[int] | np.ndarray | None = None) -> Request:
        return Request(rid, np.asarray(prompt, dtype=np.int64), max_tokens, uid=next(self._uid), cache_salt=salt,
                       output_token_ids=outputs, hasher=self.scheduler.hasher)

    def run(self, arrivals: dict[int, list[Request]], *, hooks: dict[int, Callable[[Harness], None]] | None = None,
            max_steps: int = 2000) -> Harness:
        sched = self.scheduler
        hooks = hooks or {}
        last = max(list(arrivals) + list(hooks), default=0)
        for k in range(max_steps):
            if k in hooks:
                hooks[k](self)
            for r in arrivals.get(k, ()):
                sched.add_request(r)
                self.requests[r.request_id] = r
            if self._idle():
                if k >= last:
                    return self
                continue
            out = sched.schedule()
            self._note_scheduled(k, out)
            self.preempted.extend((k, r.request_id) for r in out.preempted)
            result = self.executor.execute(out)
            sched.update_from_output(out, result.sampled_token_ids, self.executor.kv_output)  # None without a tier
            sched.make_stats()
            sched.check_integrity()
            self.steps += 1
        raise RuntimeError(f"not finished after {max_steps} steps")

    def _idle(self) -> bool:
        """Query: nothing left to step (no unfinished request)."""
        return not self.scheduler.has_unfinished_requests()

    def _note_scheduled(self, k: int, out: SchedulerOutput) -> None:
        """Changes state: step ``k``'s admissions, mixed steps and partial chunks (a step must schedule)."""
        if out.is_empty():
            raise RuntimeError(f"step {k}: nothing schedulable (pool too small?)")
        has_decode = has_chunk = False
        for s in out.scheduled:
            r = s.request
            if s.admitted:
                self.admissions.append(Admission(k, r.request_id, s.hit_tokens, list(s.new_block_ids),
                                                 r.num_preemptions > 0))
            if s.num_new_tokens == 1 and r.output_token_ids and s.num_computed_before == r.num_tokens - 1:
                has_decode = True
            elif not s.samples:
                has_chunk = True
                self.partial_chunks[r.request_id] = self.partial_chunks.get(r.request_id, 0) + 1
        self.mixed_steps += has_decode and has_chunk

    def admissions_of(self, rid: str) -> list[Admission]:
        return [a for a in self.admissions if a.request_id == rid]

    def compare(self, name: str, rids: list[str] | None = None, *, oracle: str | None = None) -> CaseResult:
        """Every kept logit vector against the dense recompute of its request's full sequence (or,
        with ``oracle``, of that one request's sequence, which must start with every compared
        request's tokens: one dense pass for all of them, for long contexts)."""
        res = CaseResult(name, getattr(self.executor.attention, "name", "?"))
        rids = list(self.requests) if rids is None else rids
        shared = None
        if oracle is not None:
            seq = self.requests[oracle].all_token_ids
            want = sorted({pos for rid in rids for pos, _ in self.executor.kept_logits.get(rid, [])})
            for rid in rids:
                toks = self.requests[rid].all_token_ids
                upto = max((pos for pos, _ in self.executor.kept_logits.get(rid, [])), default=-1) + 1
                if list(toks[:upto]) != list(seq[:upto]):
                    raise ValueError(f"{rid} is not a prefix of the oracle request {oracle}")
            shared = dict(zip(want, self.model.dense_logits(seq, positions=want).cpu()))
        for rid in rids:
            kept = self.executor.kept_logits.get(rid, [])
            if not kept:
                continue
            dense = shared if shared is not None else self.model.dense_logits(self.requests[rid].all_token_ids).cpu()
            worst = 0.0
            for pos, got in kept:
                ref = dense[pos]
                diff = (got - ref).abs().max().item()
                diff = diff if diff == diff else float("inf")
                worst = max(worst, diff)
                lp_ref, lp_got = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
                kl = float((lp_ref.exp() * (lp_ref - lp_got)).sum())
                res.max_kl = max(res.max_kl, kl if kl == kl else float("inf"))
                if int(got.argmax()) != int(ref.argmax()):
                    top2 = ref.topk(2).values
                    if float(top2[0] - top2[1]) > BF16_MARGIN:
                        res.top1_mismatches += 1
                    else:
                        res.top1_flips_near_ties += 1
                res.num_compared += 1
            res.per_request[rid] = worst
            res.max_abs_diff = max(res.max_abs_diff, worst)
        res.facts.update(
            steps=self.steps,
            preemptions=len(self.preempted),
            evictions=self.pool.num_evictions,
            mixed_steps=self.mixed_steps,
            hits={a.request_id + ("@resumed" if a.resumed else ""): a.hit_tokens for a in self.admissions},
        )
        return res


# ----------------------------------------------------------------------------- the cases


def _toks(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50_000, size=n, dtype=np.int64)


def _outs(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(10_000 + seed).integers(0, 50_000, size=n, dtype=np.int64)


def case_cold_prefill(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    h = Harness(model, attention, **hk)
    r = h.request("cold", _toks(1, 45), 3, outputs=_outs(1, 3))
    h.run({0: [r]})
    res = h.compare("cold_prefill")
    res.facts["ok_scenario"] = h.admissions_of("cold")[0].hit_tokens == 0
    return res


def case_prefix_hit(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    h = Harness(model, attention, **hk)
    prefix = _toks(2, 48)  # 3 full blocks
    a = h.request("a", np.concatenate([prefix, _toks(3, 10)]), 2, outputs=_outs(2, 2))
    b = h.request("b", np.concatenate([prefix, _toks(4, 20)]), 3, outputs=_outs(3, 3))
    shared = _toks(5, 40)  # two requests admitted in one step: the second hits the first's 2 blocks
    c = h.request("c", np.concatenate([shared, _toks(6, 7)]), 2, outputs=_outs(4, 2))
    d = h.request("d", np.concatenate([shared, _toks(7, 11)]), 2, outputs=_outs(5, 2))
    h.run({0: [a], 6: [b], 12: [c, d]})
    res = h.compare("prefix_hit")
    (ab,), (ac,), (ad,) = h.admissions_of("b"), h.admissions_of("c"), h.admissions_of("d")
    aa = h.admissions_of("a")[0]
    res.facts["ok_scenario"] = (
        ab.hit_tokens == 48 and ab.block_ids[:3] == aa.block_ids[:3]
        and ac.step == ad.step and ad.hit_tokens == 32 and ad.block_ids[:2] == ac.block_ids[:2]
    )
    return res


def case_full_block_multiple(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    h = Harness(model, attention, **hk)
    prompt = _toks(8, 64)  # exactly 4 blocks
    a = h.request("a", prompt, 1, outputs=_outs(6, 1))
    b = h.request("b", prompt, 3, outputs=_outs(7, 3))
    h.run({0: [a], 3: [b]})
    res = h.compare("full_block_multiple")
    res.facts["ok_scenario"] = h.admissions_of("b")[0].hit_tokens == 48  # k-1 = 3 of the 4 blocks
    return res


def case_chunked_prefill_decode(model: LlamaModel, attention: Attention | None = None, *, top_left: bool = False,
                                **hk: Any) -> CaseResult:
    h = Harness(model, attention, max_num_batched_tokens=24, max_num_seqs=8, **hk)
    a = h.request("a", _toks(9, 20), 8, outputs=_outs(8, 8))
    b = h.request("b", _toks(10, 70), 4, outputs=_outs(9, 4))
    h.run({0: [a], 2: [b]})
    res = h.compare("top_left_mask" if top_left else "chunked_prefill_decode")
    res.facts["b_partial_chunks"] = h.partial_chunks.get("b", 0)
    res.facts["ok_scenario"] = h.mixed_steps >= 2 and h.partial_chunks.get("b", 0) >= 2
    return res


def case_preemption_eviction(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    # 13 usable blocks of 16. "a" and "b" share a 32-token prefix; both decode long enough that
    # the pool runs dry, "b" (last in running) is preempted; "a" keeps growing into b's freed blocks,
    # evicting b's cached tail; when "a" finishes, "b" comes back and hits the surviving prefix.
    h = Harness(model, attention, num_blocks=14, max_model_len=256, **hk)
    common = _toks(11, 32)
    a = h.request("a", np.concatenate([common, _toks(12, 30)]), 90, outputs=_outs(10, 90))
    b = h.request("b", np.concatenate([common, _toks(13, 40)]), 60, outputs=_outs(11, 60))
    h.run({0: [a, b]})
    res = h.compare("preemption_eviction")
    resumed = [x for x in h.admissions_of("b") if x.resumed]
    res.facts["ok_scenario"] = bool(h.preempted) and h.pool.num_evictions > 0 and bool(resumed) and all(
        x.hit_tokens > 0 for x in resumed)
    res.facts["resumed_hits"] = [x.hit_tokens for x in resumed]
    return res


def case_salts(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    h = Harness(model, attention, **hk)
    prompt = _toks(14, 50)
    r1 = h.request("alice-1", prompt, 2, salt="alice", outputs=_outs(12, 2))
    r2 = h.request("bob-1", prompt, 2, salt="bob", outputs=_outs(12, 2))
    r3 = h.request("alice-2", prompt, 2, salt="alice", outputs=_outs(12, 2))
    h.run({0: [r1], 4: [r2], 8: [r3]})
    res = h.compare("salts")
    a1, b1, a2 = h.admissions_of("alice-1")[0], h.admissions_of("bob-1")[0], h.admissions_of("alice-2")[0]
    same = all(torch.equal(x[1], y[1]) or (x[1] - y[1]).abs().max() <= FP32_TOL
               for x, y in zip(h.executor.kept_logits["alice-1"], h.executor.kept_logits["bob-1"]))
    # no cross-salt reuse: bob hits nothing and computes its 3 full blocks into blocks of its own
    res.facts["ok_scenario"] = (b1.hit_tokens == 0 and not set(b1.block_ids[:3]) & set(a1.block_ids[:3])
                                and a2.hit_tokens == 48 and a2.block_ids[:3] == a1.block_ids[:3])
    res.facts["salted_logits_close"] = bool(same)
    return res


def case_random_mix(model: LlamaModel, attention: Attention | None = None, *, seed: int = 0, num_requests: int = 14,
                    **hk: Any) -> CaseResult:
    rng = np.random.default_rng(seed)
    h = Harness(model, attention, num_blocks=24, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=6,
                hash_algo="fast", **hk)
    prefixes = [_toks(100 + seed * 10 + i, int(rng.integers(8, 60))) for i in range(3)]
    arrivals: dict[int, list[Request]] = {}
    step = 0
    for i in range(num_requests):
        p = prefixes[int(rng.integers(0, 3))]
        prompt = np.concatenate([p, _toks(200 + seed * 100 + i, int(rng.integers(1, 40)))])
        r = h.request(f"m{i}", prompt, int(rng.integers(1, 24)),
                      salt="t2" if rng.random() < 0.2 else None)  # generated output ids (2**62 | ...)
        step += int(rng.integers(0, 4))
        arrivals.setdefault(step, []).append(r)
    h.run(arrivals)
    res = h.compare(f"random_mix[{seed}]")
    res.facts["ok_scenario"] = any(a.hit_tokens > 0 for a in h.admissions)
    return res


# ----------------------------------------------------------------------------- negative controls


def case_corrupt_shared_block(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    """Like ``prefix_hit``, but the first cached block of the shared prefix is corrupted before
    ``b`` is admitted: the comparison must fail."""
    h = Harness(model, attention, **hk)
    prefix = _toks(2, 48)
    a = h.request("a", np.concatenate([prefix, _toks(3, 10)]), 2, outputs=_outs(2, 2))
    b = h.request("b", np.concatenate([prefix, _toks(4, 20)]), 3, outputs=_outs(3, 3))
    target: list[int] = []

    def corrupt(hh: Harness) -> None:
        block = hh.admissions_of("a")[0].block_ids[0]
        target.append(block)
        hh.cache.corrupt_block(block, 3.0)

    h.run({0: [a], 6: [b]}, hooks={5: corrupt})
    res = h.compare("corrupt_shared_block", ["b"])
    res.facts["ok_scenario"] = h.admissions_of("b")[0].block_ids[0] == target[0]
    return res


def case_top_left_mask(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    """Chunked prefill + decode with ``is_causal=True`` semantics (top-left): must fail. (The
    ``attention`` argument is ignored: the point is the wrong mask.)"""
    bad = ReferenceAttention("top_left")
    return case_chunked_prefill_decode(model, SplitAttention(bad, bad), top_left=True, **hk)


CASES: dict[str, Callable[..., CaseResult]] = {
    "cold_prefill": case_cold_prefill,
    "prefix_hit": case_prefix_hit,
    "full_block_multiple": case_full_block_multiple,
    "chunked_prefill_decode": case_chunked_prefill_decode,
    "preemption_eviction": case_preemption_eviction,
    "salts": case_salts,
    "random_mix": case_random_mix,
}
NEGATIVE_CASES: dict[str, Callable[..., CaseResult]] = {
    "corrupt_shared_block": case_corrupt_shared_block,
    "top_left_mask": case_top_left_mask,
}


def run_suite(model: LlamaModel, attention: Attention | None = None, *, negatives: bool = True,
              **hk: Any) -> list[tuple[CaseResult, bool]]:
    """Every case (and the negative controls) with ``(result, verdict)``: a positive case passes
    when its comparison passes *and* its scenario happened; a negative control passes when its
    scenario happened and the comparison FAILS."""
    out = []
    for fn in CASES.values():
        r = fn(model, attention, **hk)
        out.append((r, r.passes(model.dtype) and bool(r.facts.get("ok_scenario"))))
    if negatives:
        for fn in NEGATIVE_CASES.values():
            r = fn(model, attention, **hk)
            out.append((r, (not r.passes(model.dtype)) and bool(r.facts.get("ok_scenario"))))
    return out
