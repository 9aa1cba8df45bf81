"""The ``cluster:`` section of an experiment: replicas, router, KV-event pipeline, faults.

Mirrors the knobs of the routers it models (each router model's defaults are the product's
documented defaults, see ``sim.cluster``) and a fleet description: ``replicas`` is a count or a
list of groups ``{count, gpu, engine}`` whose ``engine`` keys override the experiment's engine for
that group (mixed fleets: another GPU, pool or block size).

Invariants: frozen models, unknown keys are errors; a problem is reported against its key
(``cluster.router: Input tag 'x' ...``, ``cluster.router.weights.queue: ...``); faults must name an
existing replica, not overlap on one replica, and never leave the whole fleet down. Imports
neither simpy nor torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.experiment.disagg_config import DisaggregationConfig, check_disaggregation, replicas_from_pools
from sim.experiment.store_config import KVStoreConfig, check_store_cluster


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # as sim.experiment.config


class RoundRobinRouterConfig(_Strict):
    kind: Literal["round_robin"]


class RandomRouterConfig(_Strict):
    kind: Literal["random"]


class LeastLoadedRouterConfig(_Strict):
    kind: Literal["least_loaded"]
    by: Literal["requests", "tokens"] = "requests"


class SessionAffinityRouterConfig(_Strict):
    kind: Literal["session_affinity"]
    ttl_s: Annotated[float, Field(gt=0)] = 300.0


class LlmDWeights(_Strict):
    queue: Annotated[float, Field(ge=0)] = 2.0
    kv_cache: Annotated[float, Field(ge=0)] = 2.0
    prefix: Annotated[float, Field(ge=0)] = 3.0

    @model_validator(mode="after")
    def _not_all_zero(self) -> LlmDWeights:
        # every score 0: every replica ties on every request, and the router would pick by its
        # tie-break alone, without a word: refused (llm-d's scorers need a weight to matter)
        if self.queue == self.kv_cache == self.prefix == 0:
            raise ValueError("every weight is 0: the router would score every replica alike; give one a weight > 0")
        return self


class LlmDTierWeights(_Strict):
    """llm-d-kv-cache's ``backendConfigs``: the weight of a block cached on each device tier
    (``DefaultKVCacheBackendConfig``: gpu 1.0, cpu 0.8); a block on both scores the larger."""

    gpu: Annotated[float, Field(ge=0)] = 1.0
    cpu: Annotated[float, Field(ge=0)] = 0.8


# llm-d's shipped precise profile: precise-prefix-cache-scorer 2.0, kv-cache-utilization-scorer 1.0,
# queue-scorer 1.0 (llm-d-inference-scheduler deploy/config/epp-precise-prefix-cache-config.yaml);
# the approximate and load-only profiles keep the well-lit path's 2 : 2 : 3 (LlmDWeights' defaults)
LLM_D_PRECISE_WEIGHTS = {"queue": 1.0, "kv_cache": 1.0, "prefix": 2.0}


class LlmDRouterConfig(_Strict):
    kind: Literal["llm_d"]
    prefix: Literal["precise", "approximate", "none"] = "precise"
    weights: LlmDWeights = LlmDWeights()  # precise without weights: LLM_D_PRECISE_WEIGHTS
    tier_weights: LlmDTierWeights = LlmDTierWeights()  # precise prefix with CPU offload tiers
    block_size: Annotated[int, Field(gt=0)] = 64
    max_prefix_blocks: Annotated[int, Field(gt=0)] = 256
    lru_capacity: Annotated[int, Field(gt=0)] = 31250
    # llm-d's speculativeIndexing (precise only; off in the shipped config): the prompt's blocks are
    # indexed for the chosen replica at routing time and leave after this TTL (llm-d's default 30 s)
    speculative_ttl_s: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _precise_weights(cls, data: Any) -> Any:
        # the default depends on the prefix mode, as llm-d ships one profile per mode; weights given
        # in part take the rest from the same mode's profile (precise: 1 : 1 : 2, not 2 : 2 : 3)
        if not isinstance(data, dict) or data.get("prefix", "precise") != "precise":
            return data
        given = data.get("weights", {})
        if isinstance(given, dict):
            return {**data, "weights": {**LLM_D_PRECISE_WEIGHTS, **given}}
        return data


class DynamoRouterConfig(_Strict):
    kind: Literal["dynamo"]
    overlap_credit: Annotated[float, Field(ge=0)] = 1.0
    temperature: Annotated[float, Field(ge=0)] = 0.0
    prefill_load_scale: Annotated[float, Field(ge=0)] = 1.0
    host_cache_hit_weight: Annotated[float, Field(ge=0)] = 0.75  # --router-host-cache-hit-weight (CPU tiers)


class SGLangRouterConfig(_Strict):
    kind: Literal["sglang"]
    cache_threshold: Annotated[float, Field(ge=0, le=1)] = 0.3
    balance_abs_threshold: Annotated[int, Field(ge=0)] = 64
    balance_rel_threshold: Annotated[float, Field(ge=0)] = 1.5
    eviction_interval_s: Annotated[float, Field(ge=0)] = 120.0
    max_tree_size: Annotated[int, Field(gt=0)] = 1 << 26


class MooncakeRouterConfig(_Strict):
    kind: Literal["mooncake"]
    scope: Literal["local", "global"] = "local"  # global: the Conductor's store-aware policy (cluster.kv_store)


class OracleRouterConfig(_Strict):
    kind: Literal["oracle"]


RouterConfig = Annotated[
    RoundRobinRouterConfig | RandomRouterConfig | LeastLoadedRouterConfig | SessionAffinityRouterConfig
    | LlmDRouterConfig | DynamoRouterConfig | SGLangRouterConfig | MooncakeRouterConfig | OracleRouterConfig,
    Field(discriminator="kind"),
]
ROUTER_TAGS = {"round_robin", "random", "least_loaded", "session_affinity", "llm_d", "dynamo", "sglang",
               "mooncake", "oracle"}
"""Router kinds (also the union tags stripped from error locations)."""


class DelayConfig(_Strict):
    """A delay distribution (seconds): ``fixed`` (``mean_s``), ``uniform`` (``low_s``, ``high_s``),
    ``exponential`` (``mean_s``), ``lognormal`` (``median_s``, ``sigma``)."""

    dist: Literal["fixed", "uniform", "exponential", "lognormal"]
    mean_s: Annotated[float, Field(ge=0)] | None = None
    low_s: Annotated[float, Field(ge=0)] | None = None
    high_s: Annotated[float, Field(ge=0)] | None = None
    median_s: Annotated[float, Field(gt=0)] | None = None
    sigma: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _keys_match_dist(self) -> DelayConfig:
        need = {"fixed": ("mean_s",), "exponential": ("mean_s",), "uniform": ("low_s", "high_s"),
                "lognormal": ("median_s", "sigma")}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a {self.dist} delay needs {', '.join(missing)}")
        if self.dist == "uniform" and self.low_s is not None and self.high_s is not None and self.low_s > self.high_s:
            raise ValueError("low_s must be <= high_s")
        return self


class KVEventsConfig(_Strict):
    """The KV-event pipeline to the router: per-step batches delivered after ``delay_s`` (a number
    or a distribution); ``seed`` defaults to the experiment seed."""

    delay_s: Annotated[float, Field(ge=0)] | DelayConfig = 0.0
    seed: int | None = None


class FaultConfig(_Strict):
    replica: Annotated[int, Field(ge=0)]
    down_at: Annotated[float, Field(ge=0)]
    up_at: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _up_after_down(self) -> FaultConfig:
        if self.up_at is not None and self.up_at <= self.down_at:
            raise ValueError(f"up_at ({self.up_at}) must be after down_at ({self.down_at})")
        return self


class ReplicaGroupConfig(_Strict):
    """``count`` replicas with these overrides of the experiment's ``gpu`` and ``engine`` keys."""

    count: Annotated[int, Field(ge=1)] = 1
    gpu: str | None = None
    engine: dict[str, Any] = Field(default_factory=dict)


class ClusterConfig(_Strict):
    """``cluster:`` -- N replicas of the experiment's engine behind a router."""

    replicas: int | list[ReplicaGroupConfig] = 1
    router: RouterConfig = RoundRobinRouterConfig(kind="round_robin")
    kv_events: KVEventsConfig = KVEventsConfig()
    metrics_interval_s: Annotated[float, Field(ge=0)] = 0.05
    faults: tuple[FaultConfig, ...] = ()
    ttft_slo_s: Annotated[float, Field(gt=0)] = 2.0
    seed: int | None = None
    compare: tuple[RouterConfig, ...] = ()  # routers also replayed on the same fleet and stream
    disaggregation: DisaggregationConfig | None = None  # prefill and decode pools (sim.experiment.disagg_config)
    kv_store: KVStoreConfig | None = None  # a KV store the fleet shares (sim.experiment.store_config)

    @field_validator("compare", mode="before")
    @classmethod
    def _compare_by_name(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"kind": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("compare")
    @classmethod
    def _compare_distinct(cls, value: tuple[RouterConfig, ...]) -> tuple[RouterConfig, ...]:
        seen: dict[str, int] = {}
        for k, rc in enumerate(value):
            text = rc.model_dump_json()
            if text in seen:  # the same router twice replays the same fleet twice for one row of the table
                raise ValueError(f"compare[{k}] is compare[{seen[text]}] again ({rc.kind}); name each router once")
            seen[text] = k
        return value

    @field_validator("replicas", mode="before")
    @classmethod
    def _at_least_one(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"a cluster needs at least one replica (got {value})")
        if isinstance(value, list) and not value:
            raise ValueError("a cluster needs at least one replica group")
        return value

    @model_validator(mode="before")
    @classmethod
    def _replicas_from_pools(cls, data: Any) -> Any:
        return replicas_from_pools(data)  # disaggregation without replicas: the two pools' sum

    @model_validator(mode="before")
    @classmethod
    def _router_by_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("router"), str):
            data = {**data, "router": {"kind": data["router"]}}
        return data

    @property
    def num_replicas(self) -> int:
        return self.replicas if isinstance(self.replicas, int) else sum(g.count for g in self.replicas)

    @model_validator(mode="after")
    def _compare_not_primary(self) -> ClusterConfig:
        for k, rc in enumerate(self.compare):
            if rc == self.router:
                raise ValueError(f"compare[{k}] is the primary router ({rc.kind}) again; it is replayed already")
        return self

    @model_validator(mode="after")
    def _store_rules(self) -> ClusterConfig:
        check_store_cluster(self.kv_store, self.faults, [self.router, *self.compare])
        return self

    @model_validator(mode="after")
    def _disaggregation_rules(self) -> ClusterConfig:
        check_disaggregation(self)
        return self

    @model_validator(mode="after")
    def _faults_valid(self) -> ClusterConfig:
        n = self.num_replicas
        for k, f in enumerate(self.faults):
            if f.replica >= n:
                raise ValueError(f"faults[{k}].replica: replica {f.replica} does not exist (replicas 0..{n - 1})")
        for k, f in enumerate(self.faults):
            for j, g in enumerate(self.faults[:k]):
                if g.replica == f.replica and _overlap(f, g):
                    raise ValueError(f"faults[{k}] overlaps faults[{j}] on replica {f.replica}")
        edges = sorted([(f.down_at, 1) for f in self.faults] + [(f.up_at, -1) for f in self.faults if f.up_at])
        down = 0
        for t, d in edges:
            down += d
            if down >= n:
                raise ValueError(f"faults: every replica is down at t={t}")
        return self


def _overlap(a: FaultConfig, b: FaultConfig) -> bool:
    a_end = a.up_at if a.up_at is not None else float("inf")
    b_end = b.up_at if b.up_at is not None else float("inf")
    return a.down_at < b_end and b.down_at < a_end
