"""A token radix tree with LRU leaf eviction: one replica's approximate cache in SGLang's
cache-aware router (mirrors ``sgl-router/src/tree.rs``, which keeps the same structure over
characters for every worker at once; here there is one tree per replica, over token ids).

``insert`` adds a prompt (splitting an edge where it diverges) and stamps the nodes on its path
with the time; ``match`` returns how many leading tokens of a prompt the tree holds (an edge
matched part-way counts its matched part, as ``prefix_match`` does); ``evict_to(max_size)``
removes least-recently-used leaves until the tree holds at most ``max_size`` tokens
(``evict_tenant_by_size``). ``size`` is the tree's token count (``tenant_char_count``).

Invariants: every non-root node has a non-empty label and children keyed by their first token;
``size`` equals the sum of label lengths. Labels are copies (int32 when ids fit), so the tree keeps
no prompt alive. Cost: O(depth) numpy comparisons per match or insert, O(leaves log leaves) per
eviction round. Imports numpy only.
"""

from __future__ import annotations

import heapq

import numpy as np

_I32_MAX = np.iinfo(np.int32).max


class _Node:
    __slots__ = ("label", "children", "parent", "last_access")

    def __init__(self, label: np.ndarray, parent: _Node | None, now: float) -> None:
        self.label = label
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_access = now


def compact_prompt(tokens: np.ndarray) -> np.ndarray:
    """``tokens`` as the labels hold them (int32 when every id fits, else as given; not copied when
    already so): a prompt matched against every replica's tree is converted once, and an edge whose
    label it fully matches is then told by one byte comparison (``_common``)."""
    if tokens.size and tokens.dtype != np.int32 and int(tokens.max()) <= _I32_MAX and int(tokens.min()) >= 0:
        return tokens.astype(np.int32)
    return tokens


def _compact(tokens: np.ndarray) -> np.ndarray:
    """:func:`compact_prompt`, always a new array (a label the tree keeps must not share the caller's)."""
    c = compact_prompt(tokens)
    return c if c is not tokens else tokens.copy()


def _common(label: np.ndarray, rest: np.ndarray) -> int:
    n = min(len(label), len(rest))
    if label.dtype == rest.dtype and label[:n].tobytes() == rest[:n].tobytes():  # (equal ids: equal bytes)
        return n
    diff = np.flatnonzero(label[:n] != rest[:n])
    return int(diff[0]) if len(diff) else n


class TokenTree:
    """One replica's prefix tree (see the module docstring)."""

    def __init__(self) -> None:
        self.root = _Node(np.empty(0, dtype=np.int32), None, 0.0)
        self.size = 0

    def match(self, tokens: np.ndarray) -> int:
        """Query: leading tokens of ``tokens`` held by the tree."""
        node = self.root
        pos = 0
        n = len(tokens)
        while pos < n:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                break
            k = _common(child.label, tokens[pos:])
            pos += k
            if k < len(child.label):
                break
            node = child
        return pos

    def insert(self, tokens: np.ndarray, now: float) -> None:
        """Changes state: add ``tokens``; every node on its path is stamped ``now``."""
        node = self.root
        node.last_access = now
        pos = 0
        n = len(tokens)
        while pos < n:
            first = int(tokens[pos])
            child = node.children.get(first)
            if child is None:
                leaf = _Node(_compact(tokens[pos:]), node, now)
                node.children[first] = leaf
                self.size += n - pos
                return
            k = _common(child.label, tokens[pos:])
            if k < len(child.label):  # split the edge at k
                mid = _Node(child.label[:k].copy(), node, now)
                child.label = child.label[k:].copy()
                child.parent = mid
                mid.children[int(child.label[0])] = child
                node.children[first] = mid
                child = mid
            child.last_access = now
            pos += k
            node = child

    def evict_to(self, max_size: int) -> int:
        """Changes state: drop LRU leaves until ``size <= max_size``; returns tokens removed."""
        if self.size <= max_size:
            return 0
        removed = 0
        heap: list[tuple[float, int, _Node]] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                heap.append((node.last_access, id(node), node))
        heapq.heapify(heap)
        while self.size > max_size and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[int(leaf.label[0])]
            self.size -= len(leaf.label)
            removed += len(leaf.label)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return removed
