"""Synthetic retrieval-augmented generation (RAG) requests (mirrors a retriever's top-k documents
pasted between a system prompt and the question).

A corpus of ``corpus_size`` documents with lengths from ``doc_tokens`` and Zipf popularity
(document of popularity rank ``r`` is retrieved with weight ``(r + 1) ** -zipf``; ranks are
shuffled over document ids). Each request retrieves ``top_k`` distinct documents by popularity
and renders::

    <bos> [system hdr] SYSTEM <eot> [user hdr] (<doc> DOC_1) ... (<doc> DOC_k) QUESTION <eot>
    [assistant hdr]

The system prompt (``system_prompt_tokens``) is shared by all requests; the question is fresh.
``doc_order`` decides the order of the retrieved documents: ``relevance`` keeps retrieval order
(which varies between requests, so two requests with the same documents in a different order
share only up to the first difference), ``canonical`` sorts them by document id (a deployment
trick that raises prefix sharing). Output lengths come from ``output_tokens`` (outputs are never
reused: RAG answers are not part of later prompts).

Determinism: the corpus comes from ``rng_for(seed, 2, 0)`` and the requests, in order, from
``rng_for(seed, 2, 1)``; arrival times are not drawn here (see ``workloads.arrivals``).
Invariants: every request has ``system_tokens`` = the rendered system block; document ``d``'s
tokens are the same ids in every request that retrieves it.

Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from workloads.dists import Dist, lognormal, rng_for, zipf_cdf
from workloads.tokens import BOS, DOC_MARK, EOT, K_RAG_DOC, K_RAG_QUESTION, K_RAG_SHARED, RunTokens, header, region
from workloads.trace_format import TraceRequest

TAG = 2


@dataclass(frozen=True)
class RagParams:
    """Knobs of :func:`rag_requests`."""

    requests: int = 1000
    corpus_size: int = 5000
    doc_tokens: Dist = field(default_factory=lambda: lognormal(300, 700, 32, 2048))
    top_k: int = 5
    zipf: float = 1.0
    doc_order: Literal["relevance", "canonical"] = "relevance"
    system_prompt_tokens: int = 400
    question_tokens: Dist = field(default_factory=lambda: lognormal(30, 80, 4, 512))
    output_tokens: Dist = field(default_factory=lambda: lognormal(150, 400, 1, 2048))

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.corpus_size < 1 << 24:
            raise ValueError("need 1 <= top_k <= corpus_size < 2**24")
        if self.requests < 0 or self.requests >= 1 << 24 or self.zipf < 0 or self.system_prompt_tokens < 0:
            raise ValueError("need 0 <= requests < 2**24, zipf >= 0, system_prompt_tokens >= 0")


def _retrieve(rng: np.random.Generator, cdf: np.ndarray, k: int) -> list[int]:
    """``k`` distinct popularity ranks drawn by weight, in draw order."""
    chosen: dict[int, None] = {}
    for _ in range(64):
        for r in np.searchsorted(cdf, rng.random(4 * k), side="right"):
            chosen.setdefault(min(int(r), cdf.size - 1), None)
            if len(chosen) == k:
                return list(chosen)
    for r in range(cdf.size):  # pathological skew: fill with the most popular unused ranks
        chosen.setdefault(r, None)
        if len(chosen) == k:
            break
    return list(chosen)


def rag_requests(p: RagParams, seed: int) -> Iterator[TraceRequest]:
    """The requests in order, ``arrival`` 0 (the arrival process sets it)."""
    corpus_rng = rng_for(seed, TAG, 0)
    doc_len = p.doc_tokens.sample_int(corpus_rng, p.corpus_size, at_least=1)
    doc_of_rank = corpus_rng.permutation(p.corpus_size)
    cdf = zipf_cdf(p.corpus_size, p.zipf)
    system = RunTokens.of([BOS], header("system"), (region(K_RAG_SHARED, 0), p.system_prompt_tokens), [EOT])
    rng = rng_for(seed, TAG, 1)
    for i in range(p.requests):
        docs = [int(doc_of_rank[r]) for r in _retrieve(rng, cdf, p.top_k)]
        if p.doc_order == "canonical":
            docs.sort()
        q_len = p.question_tokens.one_int(rng, at_least=1)
        n_out = p.output_tokens.one_int(rng, at_least=1)
        parts: list[object] = [system, header("user")]
        for d in docs:
            parts += [[DOC_MARK], (region(K_RAG_DOC, d), int(doc_len[d]))]
        parts += [(region(K_RAG_QUESTION, i), q_len), [EOT], header("assistant")]
        yield TraceRequest(
            id=f"rag-{i}", arrival=0.0, tokens=RunTokens.of(*parts), output_tokens=n_out,  # type: ignore[arg-type]
            session=f"rag-{i}", system_tokens=len(system),
        )
