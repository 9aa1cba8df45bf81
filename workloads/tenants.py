"""Tenants, users, cache-salt policies, LoRA adapters and prompt-logprobs flags (mirrors vLLM's
``cache_salt`` and LoRA extra keys).

Assignment is a pure function of ``(seed, session)``: tenant ``k`` of ``num_tenants`` is drawn
with probability proportional to ``(k + 1) ** -tenant_skew`` and the user ``j`` within it with
``(j + 1) ** -user_skew``, from a keyed hash of the session id (the request id when a request has
no session). Every request of a session therefore gets the same tenant and user, whatever the
arrival process or the order requests are produced in. ``prompt_logprobs`` is drawn per request
(keyed by request id) with probability ``prompt_logprobs_fraction``.

Salt policies (vLLM ``cache_salt``; vLLM puts the salt into the extra keys of **block 0 only**, and
because block hashes are chained, a salt changes the hash of *every* block of the request):

* ``none``: no salt; all tenants share one namespace (a tenant can hit another tenant's blocks);
* ``per_tenant``: ``salt = tenant``; tenants are isolated, a tenant's sessions share;
* ``per_user``: ``salt = tenant/user``;
* ``per_session``: ``salt = session``; only turns of the same session share;
* ``per_request``: ``salt = request id``; nothing is ever shared (zero hits);
* ``shared_system_prompt``: the intent is "all tenants share the system-prompt blocks, each
  tenant's own content is isolated". **vLLM cannot express this with ``cache_salt``**: any salt is
  in block 0's hash, so a salted request shares nothing -- not even the system prompt -- with a
  differently salted one, and an unsalted request isolates nothing. What *can* be done in vLLM,
  and what this policy does: no salt, and one tenant-specific token (``TENANT_TAG_BASE + k``)
  inserted right after the system prompt (at ``TraceRequest.system_tokens``). Full blocks that lie
  entirely inside the system prompt are then shared by all tenants; the block holding the tag and
  every later block are tenant-specific, because the chain hash includes the tag. The prompt grows
  by one token. A source with no known system prompt (``system_tokens == 0``: Mooncake, Azure)
  gets the tag at position 0, which isolates tenants exactly like ``per_tenant``.

LoRA: with ``lora_adapters = n > 0`` tenant ``k`` uses adapter ``lora-{k % n}``; vLLM puts the
LoRA name into the extra keys of every block, so different adapters never share blocks.

Without a ``tenants`` section nothing is changed: requests keep the salt / LoRA / tenant their
source gave them.

**A trace's own labels win** (``assign_by: trace``, the default): a request whose source gave it a
``tenant`` (a converted chat log's ``tenant`` or ``user``, ``workloads.convert``) keeps it, and the
salt policy is applied to that tenant (tenant index = order of first appearance, for the LoRA and
``shared_system_prompt`` tags); a request that carries its own ``salt`` keeps it. Only requests
without a tenant label are drawn as above (every generator's, Mooncake's). ``assign_by: random`` draws
every request, ignoring the trace's labels (what a trace without labels gets anyway).

Invariants: assignment is a pure function of ``(seed, session)``. Imports neither simpy nor
torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from workloads.dists import zipf_cdf
from workloads.tokens import TENANT_TAG_BASE, TaggedTokens
from workloads.trace_format import TraceRequest

SaltPolicy = Literal["none", "per_tenant", "per_user", "per_session", "per_request", "shared_system_prompt"]
SALT_POLICIES: tuple[str, ...] = (
    "none", "per_tenant", "per_user", "per_session", "per_request", "shared_system_prompt",
)


def apply_salt_policy(req: TraceRequest, policy: SaltPolicy, tenant: int, user: int, session: str,
                      name: str | None = None) -> None:
    """Set ``req.tenant`` (``name``, default ``t{tenant}``) and the salt of ``policy`` for tenant
    index ``tenant``, user index ``user`` and ``session`` (for ``shared_system_prompt``: no salt and
    the tenant tag after ``req.system_tokens``; see the module docstring). Changes ``req`` in place."""
    name = f"t{tenant}" if name is None else name
    req.tenant = name
    if policy == "none":
        req.salt = None
    elif policy == "per_tenant":
        req.salt = name
    elif policy == "per_user":
        req.salt = f"{name}/u{user}"
    elif policy == "per_session":
        req.salt = f"session:{session}"
    elif policy == "per_request":
        req.salt = f"request:{req.id}"
    else:  # shared_system_prompt
        req.salt = None
        pos = min(max(req.system_tokens, 0), len(req.tokens))
        req.tokens = TaggedTokens(req.tokens, pos, TENANT_TAG_BASE + tenant)


def keyed_uniform(seed: int, purpose: str, key: str) -> float:
    """A deterministic uniform number in [0, 1) for ``(seed, purpose, key)``."""
    h = hashlib.blake2b(f"{seed}\x1f{purpose}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64


@dataclass(frozen=True, slots=True)
class TenantModel:
    """Tenant/user counts and skews, the salt policy, LoRA adapters, prompt-logprobs share."""

    num_tenants: int = 1
    tenant_skew: float = 0.0
    users_per_tenant: int = 1
    user_skew: float = 0.0
    salt: SaltPolicy = "none"
    lora_adapters: int = 0
    prompt_logprobs_fraction: float = 0.0
    seed: int = 0
    assign_by: Literal["trace", "random"] = "trace"  # trace: a request's own tenant / salt labels win
    _labels: dict[str, int] = field(default_factory=dict, compare=False, repr=False)  # tenant label -> index

    def __post_init__(self) -> None:
        if self.num_tenants < 1 or self.users_per_tenant < 1:
            raise ValueError("num_tenants and users_per_tenant must be >= 1")
        if self.tenant_skew < 0 or self.user_skew < 0 or self.lora_adapters < 0:
            raise ValueError("skews and lora_adapters must be >= 0")
        if not 0.0 <= self.prompt_logprobs_fraction <= 1.0:
            raise ValueError("prompt_logprobs_fraction must be in [0, 1]")
        if self.salt not in SALT_POLICIES:
            raise ValueError(f"unknown salt policy {self.salt!r}; choose one of {SALT_POLICIES}")
        if self.assign_by not in ("trace", "random"):
            raise ValueError(f"assign_by must be 'trace' or 'random', got {self.assign_by!r}")

    def assign(self, session: str) -> tuple[int, int]:
        """``(tenant, user)`` indices of a session."""
        t = int(np.searchsorted(zipf_cdf(self.num_tenants, self.tenant_skew),
                                keyed_uniform(self.seed, "tenant", session), side="right"))
        u = int(np.searchsorted(zipf_cdf(self.users_per_tenant, self.user_skew),
                                keyed_uniform(self.seed, "user", session), side="right"))
        return min(t, self.num_tenants - 1), min(u, self.users_per_tenant - 1)

    def apply(self, req: TraceRequest) -> TraceRequest:
        """Set tenant, salt, LoRA, prompt-logprobs (and the tag for ``shared_system_prompt``)."""
        session = req.session if req.session is not None else req.id
        t, u = self.assign(session)
        label = req.tenant if self.assign_by == "trace" else None
        own_salt = req.salt if self.assign_by == "trace" else None
        if label is not None:  # the trace's tenant wins; its index (first appearance) tags LoRA and prompts
            t = self._labels.setdefault(label, len(self._labels))
        apply_salt_policy(req, self.salt, t, u, session, label)
        if own_salt is not None:
            req.salt = own_salt
        req.lora = f"lora-{t % self.lora_adapters}" if self.lora_adapters else req.lora
        if self.prompt_logprobs_fraction > 0:
            req.prompt_logprobs = keyed_uniform(self.seed, "plp", req.id) < self.prompt_logprobs_fraction
        return req

    def decorate(self, requests: Iterable[TraceRequest]) -> Iterator[TraceRequest]:
        for req in requests:
            yield self.apply(req)
