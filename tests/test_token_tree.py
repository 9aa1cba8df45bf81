"""SGLang's token tree (``sim.cluster.token_tree``) against a brute-force oracle: ``match`` is the
longest common prefix with any inserted prompt, whether the prompts come as int64 ids or compacted
once per request (``compact_prompt``, the router's path), with ids beyond int32 mixed in."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.token_tree import TokenTree, compact_prompt

_BIG = 2**40  # an id no int32 holds: that prompt stays int64 beside int32 labels


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = 0
    for x, y in zip(a.tolist(), b.tolist()):
        if x != y:
            break
        n += 1
    return n


@settings(max_examples=150, deadline=None)
@given(prompts=st.lists(st.lists(st.sampled_from([0, 1, 2, 3, _BIG]), min_size=1, max_size=12), min_size=1,
                        max_size=12),
       compact=st.lists(st.booleans(), min_size=24, max_size=24))
def test_match_is_the_longest_common_prefix_with_any_inserted_prompt(prompts, compact) -> None:
    tree = TokenTree()
    inserted: list[np.ndarray] = []
    for k, p in enumerate(prompts):
        ids = np.array(p, dtype=np.int64)
        query = compact_prompt(ids) if compact[2 * k] else ids
        assert query.tolist() == p and (query.dtype == np.int32) == (compact[2 * k] and _BIG not in p)
        want = max((_lcp(ids, q) for q in inserted), default=0)
        assert tree.match(query) == want
        tree.insert(compact_prompt(ids) if compact[2 * k + 1] else ids, now=float(k))
        inserted.append(ids)
        assert tree.size == sum(len(n.label) for n in _nodes(tree))
    for q in inserted:
        assert tree.match(compact_prompt(q)) == tree.match(q) == len(q)


def _nodes(tree: TokenTree) -> list:
    out, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out
