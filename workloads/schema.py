"""The ``workload:`` section of an experiment config (pydantic models; unknown keys are errors;
mirrors nothing in vLLM).

Every kind shares ``limit`` (max requests replayed), ``seed`` (default: the experiment seed),
``arrival`` (how requests or sessions are placed on the timeline) and ``tenants`` (tenant/user
assignment, salt policy, LoRA, prompt-logprobs share; absent = leave requests as the source made
them). Generator defaults are read from the generators' own parameter classes, so the resolved
config written beside results shows every value that was used. A length/time knob accepts a
number (a fixed value) or ``{dist: fixed|uniform|exponential|lognormal|geometric, ...}``
(``workloads.dists``). Invariants: every model is frozen and forbids unknown keys. Imports
neither simpy nor torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from workloads.agent import AgentParams
from workloads.chat import ChatParams
from workloads.dists import Dist
from workloads.rag import RagParams
from workloads.tenants import SaltPolicy


class _Strict(BaseModel):
    # finite floats only: a rate, time_scale or distribution bound of .inf / .nan is refused
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _number_is_fixed(v: Any) -> Any:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return {"dist": "fixed", "mean": v}
    return v


class DistSpec(_Strict):
    """A distribution (see ``workloads.dists.Dist``)."""

    dist: Literal["fixed", "uniform", "exponential", "lognormal", "geometric"]
    mean: float | None = None
    median: float | None = None
    sigma: float = 1.0
    low: float | None = None
    high: float | None = None
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check(self) -> DistSpec:
        self.to_dist()
        return self

    def to_dist(self) -> Dist:
        return Dist(**self.model_dump())

    @classmethod
    def of(cls, d: Dist) -> DistSpec:
        return cls(dist=d.dist, mean=d.mean, median=d.median, sigma=d.sigma, low=d.low, high=d.high,
                   min=d.min, max=d.max)


DistField = Annotated[DistSpec, BeforeValidator(_number_is_fixed)]
Pos = Annotated[int, Field(gt=0)]
NonNeg = Annotated[int, Field(ge=0)]
Scale = Annotated[float, Field(gt=0)]


# -- arrival processes ------------------------------------------------------------------------
class PoissonArrivals(_Strict):
    kind: Literal["poisson"]
    rate: Scale  # requests (or sessions) per second
    rate_scale: Scale = 1.0
    seed: int | None = None


class GammaArrivals(_Strict):
    kind: Literal["gamma"]
    rate: Scale
    cv: Scale = 2.0  # coefficient of variation of the gaps; > 1 is bursty
    rate_scale: Scale = 1.0
    seed: int | None = None


class TraceArrivals(_Strict):
    kind: Literal["trace"]  # the source's own timestamps (trace sources only)
    rate_scale: Scale = 1.0


class AzureArrivals(_Strict):
    kind: Literal["azure"]
    path: str | None = None  # default: <shared traces>/azure_llm_2023/AzureLLMInferenceTrace_<trace>.csv
    trace: Literal["code", "conv"] = "code"
    rate_scale: Scale = 1.0
    skip_bad_lines: bool = False


ArrivalSpec = Annotated[
    PoissonArrivals | GammaArrivals | TraceArrivals | AzureArrivals, Field(discriminator="kind")
]


class TenantSpec(_Strict):
    """Tenants and users per session, salt policy, LoRA per tenant, prompt-logprobs share."""

    num_tenants: Pos = 1
    tenant_skew: Annotated[float, Field(ge=0)] = 0.0
    users_per_tenant: Pos = 1
    user_skew: Annotated[float, Field(ge=0)] = 0.0
    salt: SaltPolicy = "none"
    lora_adapters: NonNeg = 0
    prompt_logprobs_fraction: Annotated[float, Field(ge=0, le=1)] = 0.0
    seed: int | None = None
    # trace: a request's own tenant / salt labels win, the rest are drawn; random: draw every request
    assign_by: Literal["trace", "random"] = "trace"


class _Common(_Strict):
    limit: Pos | None = None
    seed: int | None = None
    arrival: ArrivalSpec | None = None
    tenants: TenantSpec | None = None


# -- trace sources ----------------------------------------------------------------------------
class MooncakeWorkload(_Common):
    """A Mooncake FAST'25 trace (512-token chained block ids), re-blocked to token ids."""

    kind: Literal["mooncake"]
    path: str | None = None  # default: <shared traces>/mooncake/conversation_trace.jsonl
    start: NonNeg = 0
    time_scale: Scale = 1.0
    tokens_per_id: Pos = 512
    max_output_tokens: Pos | None = None
    skip_bad_lines: bool = False
    allow_empty: bool = False  # replay no requests when every line was skipped (else an error)


class BailianWorkload(_Common):
    """A Qwen-Bailian usage trace (16-token chained block ids), re-blocked to token ids (``workloads.bailian``)."""

    kind: Literal["bailian"]
    path: str
    time_scale: Scale = 1.0
    tokens_per_id: Pos = 16
    max_output_tokens: Pos | None = None
    type_as_tenant: bool = False  # the request type (text/search/image/file) as the tenant label
    skip_bad_lines: bool = False
    allow_empty: bool = False  # replay no requests when every line was skipped (else an error)


class TraceWorkload(_Common):
    """A canonical token-level JSONL trace (see ``workloads.trace_format``)."""

    kind: Literal["trace"]
    path: str
    skip_bad_lines: bool = False
    allow_empty: bool = False  # replay no requests when every line was skipped (else an error)


class RagPulseWorkload(_Common):
    """The RAGPulse trace folder (``workloads.ragpulse``)."""

    kind: Literal["ragpulse"]
    path: str | None = None  # default: <shared traces>/ragpulse
    max_output_tokens: Pos | None = None
    skip_bad_lines: bool = False


class AgentTraceWorkload(_Common):
    """Coding-agent session files (``workloads.agent_sessions``); sessions placed by ``arrival``."""

    kind: Literal["agent_trace"]
    path: str | None = None  # default: <shared traces>/weka_agent_sample
    sessions: Pos | None = None  # the first N session files (name order)
    shared_prompt_fraction: Annotated[float, Field(ge=0, le=1)] = 1.0
    max_output_tokens: Pos | None = None
    skip_bad_lines: bool = False


class AzureWorkload(_Common):
    """Azure LLM 2023 rows as requests with unique prompts (``workloads.azure``)."""

    kind: Literal["azure"]
    path: str | None = None
    trace: Literal["code", "conv"] = "code"
    max_output_tokens: Pos | None = None
    skip_bad_lines: bool = False


# -- generators -------------------------------------------------------------------------------
_R, _C, _A = RagParams(), ChatParams(), AgentParams()


class SharedPrefixWorkload(_Common):
    """Synthetic requests sharing a few popular prefixes (Zipf), Poisson arrivals."""

    kind: Literal["synthetic_shared_prefix"]
    num_requests: Pos = 200
    num_prefixes: Pos = 4
    prefix_tokens: Pos = 1024
    suffix_tokens: Pos = 256
    output_tokens: Pos = 64
    rate: Scale = 10.0
    zipf: Annotated[float, Field(ge=0)] = 1.0
    suffixes_per_prefix: Pos | None = None  # fixed "users" per prefix, each repeating its suffix


class _Generator(_Common):
    @model_validator(mode="after")
    def _params_consistent(self) -> _Generator:
        generator_params(self)  # type: ignore[arg-type]  # raises ValueError on inconsistent knobs
        return self


class RagWorkload(_Generator):
    """Synthetic RAG (``workloads.rag``)."""

    kind: Literal["rag"]
    requests: Pos = _R.requests
    corpus_size: Pos = _R.corpus_size
    doc_tokens: DistField = DistSpec.of(_R.doc_tokens)
    top_k: Pos = _R.top_k
    zipf: Annotated[float, Field(ge=0)] = _R.zipf
    doc_order: Literal["relevance", "canonical"] = _R.doc_order
    system_prompt_tokens: NonNeg = _R.system_prompt_tokens
    question_tokens: DistField = DistSpec.of(_R.question_tokens)
    output_tokens: DistField = DistSpec.of(_R.output_tokens)


class ChatWorkload(_Generator):
    """Synthetic multi-turn chat (``workloads.chat``)."""

    kind: Literal["chat"]
    sessions: Pos = _C.sessions
    turns: DistField = DistSpec.of(_C.turns)
    system_prompt_tokens: NonNeg = _C.system_prompt_tokens
    system_prompts: Pos = _C.system_prompts
    user_tokens: DistField = DistSpec.of(_C.user_tokens)
    output_tokens: DistField = DistSpec.of(_C.output_tokens)
    think_time: DistField = DistSpec.of(_C.think_time)
    max_context_tokens: Pos = _C.max_context_tokens


class AgentWorkload(_Generator):
    """Synthetic tool-using agent (``workloads.agent``)."""

    kind: Literal["agent"]
    sessions: Pos = _A.sessions
    tool_tokens: NonNeg = _A.tool_tokens
    system_prompt_tokens: NonNeg = _A.system_prompt_tokens
    initial_context_tokens: DistField = DistSpec.of(_A.initial_context_tokens)
    steps: DistField = DistSpec.of(_A.steps)
    tool_result_tokens: DistField = DistSpec.of(_A.tool_result_tokens)
    output_tokens: DistField = DistSpec.of(_A.output_tokens)
    step_gap: DistField = DistSpec.of(_A.step_gap)
    max_context_tokens: Pos = _A.max_context_tokens
    summary_tokens: Pos = _A.summary_tokens
    subagent_probability: Annotated[float, Field(ge=0, le=1)] = _A.subagent_probability
    subagent_prompt_tokens: NonNeg = _A.subagent_prompt_tokens
    subagent_steps: DistField = DistSpec.of(_A.subagent_steps)
    subagent_task_tokens: DistField = DistSpec.of(_A.subagent_task_tokens)


GENERATOR_KNOBS: dict[str, tuple[type, tuple[str, ...]]] = {
    "rag": (RagParams, tuple(RagParams.__dataclass_fields__)),
    "chat": (ChatParams, tuple(ChatParams.__dataclass_fields__)),
    "agent": (AgentParams, tuple(AgentParams.__dataclass_fields__)),
}


def generator_params(w: RagWorkload | ChatWorkload | AgentWorkload) -> Any:
    """The generator's parameter object for a validated config section."""
    cls, names = GENERATOR_KNOBS[w.kind]
    kwargs = {n: (getattr(w, n).to_dist() if isinstance(getattr(w, n), DistSpec) else getattr(w, n)) for n in names}
    return cls(**kwargs)


WorkloadConfig = Annotated[
    MooncakeWorkload | BailianWorkload | TraceWorkload | SharedPrefixWorkload | RagPulseWorkload | AgentTraceWorkload
    | AzureWorkload | RagWorkload | ChatWorkload | AgentWorkload,
    Field(discriminator="kind"),
]

UNION_TAGS = frozenset({
    "mooncake", "bailian", "trace", "synthetic_shared_prefix", "ragpulse", "agent_trace", "azure", "rag", "chat",
    "agent", "poisson", "gamma", "function-before[_number_is_fixed(), DistSpec]",
})
"""Tags pydantic inserts into error locations of the unions above (stripped from messages)."""
