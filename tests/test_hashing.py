"""Block hashing (spec §3): chaining, full blocks only, extra keys, byte-exact sha256, and the
``fast`` hasher's equality structure."""

from __future__ import annotations

import hashlib
import pickle

import pytest
from conftest import make_request, toks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.hashing import (
    ExactBlockHasher,
    FastBlockHasher,
    block_extra_keys,
    external_block_hash,
    make_block_hasher,
)
from sim.core.request import GENERATED_TOKEN_BASE, MMFeature

BS = 16


def sha(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def by_hand(tokens, extras=None, seed="0", bs=BS) -> list[bytes]:
    """vLLM's chain written out: NONE_HASH = sha256(pickle(str(seed)))."""
    parent = sha(str(seed))
    out = []
    for i in range(len(tokens) // bs):
        extra = extras[i] if extras is not None else None
        parent = sha((parent, tuple(tokens[i * bs : (i + 1) * bs]), extra))
        out.append(parent)
    return out


@pytest.fixture(params=["sha256", "fast"])
def hasher(request):
    return make_block_hasher(request.param, BS, 0)


# -- byte-exact sha256 -------------------------------------------------------------------------


def test_none_hash_is_hash_of_seed_string():
    assert ExactBlockHasher("sha256", BS, 0).none_hash == sha("0")
    assert ExactBlockHasher("sha256", BS, "1234").none_hash == sha("1234")


def test_sha256_byte_identical_to_hand_computation():
    h = ExactBlockHasher("sha256", BS, 0)
    tokens = toks(40, 100)
    r = make_request(h, "r", tokens)
    assert r.block_hashes == by_hand(tokens)
    assert len(r.block_hashes) == 2
    assert all(len(x) == 32 for x in r.block_hashes)
    # a different seed changes every hash (NONE_HASH seeds the chain)
    r2 = make_request(ExactBlockHasher("sha256", BS, 7), "r2", tokens)
    assert r2.block_hashes == by_hand(tokens, seed="7")
    assert set(r2.block_hashes).isdisjoint(r.block_hashes)


def test_sha256_byte_identical_with_extra_keys():
    h = ExactBlockHasher("sha256", BS, 0)
    tokens = toks(48, 5)
    r = make_request(h, "r", tokens, cache_salt="s", lora_name="L", lora_int_id=3)
    # order: LoRA name, MM keys, salt (block 0 only)
    assert r.block_hashes == by_hand(tokens, [("L", "s"), ("L",), ("L",)])


def test_hash_token_blocks_matches_request_hashing(hasher):
    tokens = toks(50, 9)
    assert hasher.hash_token_blocks(tokens) == make_request(hasher, "r", tokens).block_hashes


def test_external_block_hash_is_low_64_bits_big_endian():
    h = bytes(range(32))
    assert external_block_hash(h) == int.from_bytes(h[-8:], "big")
    assert external_block_hash(h) == int.from_bytes(h, "big") & ((1 << 64) - 1)


def test_other_exact_algorithms_available():
    # cbor / xxhash variants: byte lengths as vLLM's (32 for sha256*, 16 for xxh3_128)
    for algo, size in [("sha256_cbor", 32), ("xxhash", 16), ("xxhash_cbor", 16)]:
        try:
            h = make_block_hasher(algo, BS, 0)
            r = make_request(h, "r", toks(32))
        except ImportError:  # pragma: no cover - optional packages
            pytest.skip(f"{algo} needs an optional package")
        assert len(r.block_hashes) == 2 and all(len(x) == size for x in r.block_hashes)
    with pytest.raises(ValueError):
        make_block_hasher("builtin", BS)


# -- structure ---------------------------------------------------------------------------------


def test_only_full_blocks_are_hashed(hasher):
    for n, expect in [(1, 0), (15, 0), (16, 1), (17, 1), (47, 2), (48, 3), (49, 3)]:
        assert len(make_request(hasher, f"r{n}", toks(n)).block_hashes) == expect


def test_hashes_are_chained(hasher):
    base = toks(64)
    h = make_request(hasher, "a", base).block_hashes
    # changing a token in block 1 keeps block 0 and changes blocks 1..3
    t = list(base)
    t[20] = 999
    h1 = make_request(hasher, "b", t).block_hashes
    assert h1[0] == h[0] and all(h1[i] != h[i] for i in (1, 2, 3))
    # changing block 0 changes every block, even though blocks 1..3 have the same tokens
    t = list(base)
    t[0] = 999
    h0 = make_request(hasher, "c", t).block_hashes
    assert all(h0[i] != h[i] for i in range(4))
    # the same block content at another position hashes differently (the parent differs)
    rep = toks(16) * 3
    hr = make_request(hasher, "d", rep).block_hashes
    assert len(set(hr)) == 3


def test_salt_only_on_block_zero_and_only_if_truthy(hasher):
    tokens = toks(48)
    none = make_request(hasher, "n", tokens)
    empty = make_request(hasher, "e", tokens, cache_salt="")
    x = make_request(hasher, "x", tokens, cache_salt="x")
    x2 = make_request(hasher, "x2", tokens, cache_salt="x")
    y = make_request(hasher, "y", tokens, cache_salt="y")
    assert empty.block_hashes == none.block_hashes  # "" == no salt
    assert x.block_hashes == x2.block_hashes
    for i in range(3):  # the salt poisons the whole chain
        assert len({none.block_hashes[i], x.block_hashes[i], y.block_hashes[i]}) == 3
    assert block_extra_keys(x, 0, 16, 0)[0] == ("x",)
    assert block_extra_keys(x, 16, 32, 0)[0] is None
    assert block_extra_keys(empty, 0, 16, 0)[0] is None


def test_lora_name_not_id_in_every_block(hasher):
    tokens = toks(48)
    plain = make_request(hasher, "p", tokens)
    l1a = make_request(hasher, "a", tokens, lora_name="L1", lora_int_id=1)
    l1b = make_request(hasher, "b", tokens, lora_name="L1", lora_int_id=7)
    l2 = make_request(hasher, "c", tokens, lora_name="L2", lora_int_id=1)
    assert l1a.block_hashes == l1b.block_hashes
    for i in range(3):
        assert len({plain.block_hashes[i], l1a.block_hashes[i], l2.block_hashes[i]}) == 3
        assert block_extra_keys(l1a, 16 * i, 16 * (i + 1), 0)[0] == ("L1",)


def test_extra_keys_none_when_empty_and_ordered_lora_mm_salt():
    h = make_block_hasher("sha256", BS)
    plain = make_request(h, "p", toks(32))
    assert block_extra_keys(plain, 0, 16, 0) == (None, 0)
    mm = [MMFeature("img", 4, 8)]
    r = make_request(h, "r", toks(32), lora_name="L", cache_salt="s", mm_features=mm)
    assert block_extra_keys(r, 0, 16, 0)[0] == ("L", ("img", 4), "s")
    assert block_extra_keys(r, 16, 32, 0)[0] == ("L",)


def test_mm_keys_offset_relative_to_block_incl_negative():
    h = make_block_hasher("sha256", BS)
    # item a spans tokens [10, 40): blocks 0, 1, 2; item b spans [40, 44): block 2
    mm = [MMFeature("a", 10, 30), MMFeature("b", 40, 4)]
    r = make_request(h, "r", toks(64), mm_features=mm)
    keys = []
    idx = 0
    for i in range(4):
        k, idx = block_extra_keys(r, 16 * i, 16 * (i + 1), idx)
        keys.append(k)
    assert keys == [(("a", 10),), (("a", -6),), (("a", -22), ("b", 8)), None]
    tokens = toks(64)
    assert r.block_hashes == by_hand(tokens, keys)
    # same placeholder tokens, different item identifier or position -> different hashes
    r2 = make_request(h, "r2", tokens, mm_features=[MMFeature("a2", 10, 30), MMFeature("b", 40, 4)])
    assert r2.block_hashes[0] != r.block_hashes[0]
    r3 = make_request(h, "r3", tokens, mm_features=[MMFeature("a", 11, 29), MMFeature("b", 40, 4)])
    assert r3.block_hashes[0] != r.block_hashes[0]


def test_mm_resumed_pass_scans_from_last_item():
    """Blocks completed by generated tokens are hashed in a pass that starts at the *last* MM item
    (vLLM's ``curr_mm_idx = -1``), so an earlier item still overlapping that block is not keyed --
    unlike a fresh pass over the same tokens. vLLM-faithful, spec §3.2."""
    h = make_block_hasher("sha256", BS)
    mm = [MMFeature("a", 30, 6), MMFeature("b", 33, 2)]  # both overlap block 2 = [32, 48)
    prompt = toks(40)
    outs = toks(8, 1000)
    r = make_request(h, "r", prompt, max_tokens=8, mm_features=mm, output_token_ids=outs)
    assert len(r.block_hashes) == 2
    for t in outs:
        r.append_output_token_ids(t)
    assert len(r.block_hashes) == 3
    fresh = make_request(h, "f", prompt + outs, mm_features=mm)
    assert fresh.block_hashes[:2] == r.block_hashes[:2]
    parent = r.block_hashes[1]
    blk = tuple(prompt[32:] + outs)
    assert fresh.block_hashes[2] == sha((parent, blk, (("a", -2), ("b", 1))))
    assert r.block_hashes[2] == sha((parent, blk, (("b", 1),)))
    # the resumed pass stops keying MM once the block starts after the last item
    r.append_output_token_ids(toks(16, 2000))
    assert r.block_hashes[3] == sha((r.block_hashes[2], tuple(toks(16, 2000)), None))


# -- incremental hashing -----------------------------------------------------------------------


@pytest.mark.parametrize("salt,lora", [(None, None), ("s", None), (None, "L"), ("s", "L")])
def test_incremental_equals_whole_sequence(hasher, salt, lora):
    prompt = toks(37, 3)
    outs = toks(60, 500)
    r = make_request(hasher, "r", prompt, max_tokens=60, output_token_ids=outs, cache_salt=salt, lora_name=lora)
    assert not r.unique_outputs
    for j, t in enumerate(outs):
        r.append_output_token_ids(t if j % 2 else [t])  # both append forms
    whole = make_request(hasher, "w", prompt + outs, cache_salt=salt, lora_name=lora)
    assert len(r.block_hashes) == (37 + 60) // BS
    assert r.block_hashes == whole.block_hashes
    # appending several tokens at once gives the same
    r2 = make_request(hasher, "r2", prompt, max_tokens=60, output_token_ids=outs, cache_salt=salt, lora_name=lora)
    r2.append_output_token_ids(outs[:25])
    r2.append_output_token_ids(outs[25:])
    assert r2.block_hashes == whole.block_hashes


_append = st.one_of(
    st.integers(0, 3).map(lambda n: ("planned", n)),  # the next n planned ids, as one range
    st.integers(0, 3).map(lambda n: ("window", n)),  # the same through append_planned_outputs
    st.just(("one", 0)),  # the next planned id, as an int
    st.integers(0, 2**20).map(lambda t: ("other", t)),  # an id off the plan
    st.just(("empty", 0)),
)


@settings(max_examples=200, deadline=None)
@given(appends=st.lists(_append, max_size=12), algo=st.sampled_from(["sha256", "fast"]))
def test_generated_outputs_are_a_range_until_an_id_breaks_the_run(appends, algo):
    """``output_token_ids`` holds a request's outputs as a ``range`` while they are consecutive ids
    (the generated ones are), and as a list from the first id that does not continue them; either
    way it reads as the list of every id appended, in order, and (sha256) hashes as a list-fed twin."""
    h = make_block_hasher(algo, 4, 0)
    r = make_request(h, "r", toks(6), max_tokens=100, uid=3)
    twin = make_request(h, "t", toks(6), max_tokens=100, uid=3, output_token_ids=list(range(100)))
    assert r.unique_outputs and type(r.output_token_ids) is range
    expect: list[int] = []
    for kind, n in appends:
        j = len(r.output_token_ids)
        if kind == "planned":
            ids = r.planned_output_tokens(j, n)
            assert type(ids) is range and list(ids) == [r.planned_output_token(j + i) for i in range(n)]
            r.append_output_token_ids(ids)
            new = list(ids)
        elif kind == "window":  # the decode fast-forward's form
            new = list(r.planned_output_tokens(j, n))
            r.append_planned_outputs(n)
        elif kind == "one":
            new = [r.planned_output_token(j)]
            r.append_output_token_ids(new[0])
        elif kind == "other":
            new = [n]
            r.append_output_token_ids(n)
        else:
            new = []
            r.append_output_token_ids([])
        expect += new
        twin.append_output_token_ids(new)
        assert list(r.output_token_ids) == expect
        consecutive = all(b == a + 1 for a, b in zip(expect, expect[1:]))
        assert type(r.output_token_ids) is (range if consecutive else list)
        assert r.num_tokens == 6 + len(expect)
        assert len(r.block_hashes) == len(twin.block_hashes) == r.num_tokens // 4
        assert r.token_slice(0, r.num_tokens).tolist() == toks(6) + expect
        for a in range(0, r.num_tokens + 1, 3):  # every cut: prompt only, across the boundary, outputs only
            for b in range(a, r.num_tokens + 1, 2):
                span = r.token_span(a, b)  # a BlockStored's ids, read later
                assert len(span) == b - a
                got = span.tolist()
                assert got == r.token_slice(a, b).tolist() == (toks(6) + expect)[a:b] == span
                assert all(type(x) is int for x in got)
        assert r.all_token_ids == toks(6) + expect
        if algo == "sha256":  # the exact hash reads the ids themselves
            assert r.block_hashes == twin.block_hashes


def test_fast_unique_outputs_keys_unique_per_request_and_block():
    fast = FastBlockHasher(BS, 0)
    prompt = toks(40)
    a = make_request(fast, "a", prompt, max_tokens=50, uid=11)
    b = make_request(fast, "b", prompt, max_tokens=50, uid=12)
    assert a.unique_outputs and b.unique_outputs
    for j in range(50):
        a.append_output_token_ids(a.planned_output_token(j))
        b.append_output_token_ids(b.planned_output_token(j))
        assert a.output_token_ids[-1] >= GENERATED_TOKEN_BASE
    n = (40 + 50) // BS
    assert len(a.block_hashes) == len(b.block_hashes) == n == 5
    # prompt-only blocks: the real chained hash, shared between the requests
    assert a.block_hashes[:2] == b.block_hashes[:2] == fast.hash_token_blocks(prompt)
    # blocks holding generated tokens (from block 2, which mixes prompt and outputs): unique keys
    gen_a, gen_b = a.block_hashes[2:], b.block_hashes[2:]
    assert set(gen_a).isdisjoint(gen_b)
    assert len(set(gen_a)) == len(gen_a)
    # ... that depend on (uid, block index) only: a twin with the same uid gets the same keys
    twin = make_request(fast, "twin", prompt, max_tokens=50, uid=11)
    for j in range(50):
        twin.append_output_token_ids(twin.planned_output_token(j))
    assert twin.block_hashes == a.block_hashes
    # and sha256 over the generated ids has the same equality structure
    sha_h = make_block_hasher("sha256", BS)
    sa = make_request(sha_h, "sa", prompt, max_tokens=50, uid=11)
    sb = make_request(sha_h, "sb", prompt, max_tokens=50, uid=12)
    for j in range(50):
        sa.append_output_token_ids(sa.planned_output_token(j))
        sb.append_output_token_ids(sb.planned_output_token(j))
    assert [x == y for x, y in zip(sa.block_hashes, sb.block_hashes)] == [
        x == y for x, y in zip(a.block_hashes, b.block_hashes)
    ]


def test_fast_unique_outputs_block_aligned_prompt():
    fast = FastBlockHasher(BS, 0)
    a = make_request(fast, "a", toks(32), max_tokens=40, uid=21)
    for j in range(40):
        a.append_output_token_ids(a.planned_output_token(j))
    assert a.block_hashes[:2] == fast.hash_token_blocks(toks(32))
    assert len(a.block_hashes) == 4 and len(set(a.block_hashes)) == 4


# -- fast vs sha256 equality structure (property) ----------------------------------------------

_prefix = st.lists(st.integers(0, 3), min_size=16, max_size=80)
_req = st.tuples(
    st.sampled_from([1.0, 1.0, 0.5, 0.25]),  # share of the prefix kept
    st.lists(st.integers(0, 1), min_size=0, max_size=40),  # suffix after it
    st.sampled_from([None, None, None, "", "x", "y"]),  # salt
    st.sampled_from([None, None, "L1", "L2"]),  # lora
    st.lists(st.integers(0, 1), min_size=0, max_size=40),  # outputs appended afterwards
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=_prefix, reqs=st.lists(_req, min_size=2, max_size=4))
def test_fast_has_sha256_equality_structure(prefix, reqs):
    fast = make_block_hasher("fast", BS, 0)
    exact = make_block_hasher("sha256", BS, 0)
    fh: list[list[bytes]] = []
    sh: list[list[bytes]] = []
    for i, (keep, suffix, salt, lora, outs) in enumerate(reqs):
        prompt = prefix[: int(len(prefix) * keep)] + suffix
        for hsr, dst in ((fast, fh), (exact, sh)):
            r = make_request(
                hsr, f"r{i}", prompt, max_tokens=max(1, len(outs)), cache_salt=salt, lora_name=lora,
                output_token_ids=outs or [0],
            )
            for t in outs:
                r.append_output_token_ids(t)
            dst.append(r.block_hashes)
    for a in range(len(reqs)):
        assert len(fh[a]) == len(sh[a])
        for b in range(len(reqs)):
            for i in range(len(fh[a])):
                for j in range(len(fh[b])):
                    assert (fh[a][i] == fh[b][j]) == (sh[a][i] == sh[b][j]), (a, b, i, j)
