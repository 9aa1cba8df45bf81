"""Experiment configuration (mirrors vLLM 0.25.1's engine arguments and their defaults): YAML
validated by pydantic models (unknown keys are errors).

``load_config(path)`` returns an :class:`ExperimentConfig` or raises :class:`ConfigError`, whose
message names the file and the offending key (``configs/x.yaml: engine.blok_size: unknown key``).
Input paths inside a config (traces, fitted latency files) are resolved against the config
file's directory; ``output_dir`` is relative to the working directory.
Strict input: YAML is read by ``sim.experiment.strict_yaml`` (a key given twice, bytes that are
not UTF-8 and bad syntax are refused with ``file:line``); float keys take finite numbers only;
block sizes of a config file follow vLLM 0.25.1's attention backends
(``sim.experiment.block_size_rule``; :func:`config_from_dict` applies it with ``startup_checks``). A
problem caused by ``--set key=value`` names the override (``--set engine.block_size=7:
engine.block_size: ...``), not the file.
Invariants: every model is frozen and forbids unknown keys; a problem is one ``ConfigError``
line per bad key, ``file: key: problem``. Imports neither simpy nor torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sim.core.hashing import HASH_ALGOS
from sim.core.kv_cache_spec import KVGroupSpec, check_groups
from sim.experiment.block_size_rule import check_block_size
from sim.experiment.cluster_config import ROUTER_TAGS, ClusterConfig
from sim.experiment.config_error import ConfigError
from sim.experiment.config_messages import MAX_LINES, error_lines
from sim.experiment.offload_tier import check_offload_keys, check_offload_size
from sim.experiment.overrides import (  # noqa: F401  (re-exported: callers import them from here)
    apply_overrides,
    blame_override,
    override_value,
    set_dotted,
)
from sim.experiment.sidechannel_config import SideChannelConfig
from sim.experiment.strict_scalars import scalar_problems
from sim.experiment.strict_yaml import YAMLInputError, load_yaml_file
from sim.experiment.version_keys import DEFAULT_VERSION, check_engine_keys, check_version, check_version_key, hash_unit
from sim.timing.step_noise import DEFAULT_SIGMA
from workloads.paths import input_path
from workloads.schema import UNION_TAGS as _WORKLOAD_TAGS
from workloads.schema import (  # noqa: F401  (re-exported: the workload models)
    AgentTraceWorkload,
    AgentWorkload,
    AzureWorkload,
    ChatWorkload,
    MooncakeWorkload,
    RagPulseWorkload,
    RagWorkload,
    SharedPrefixWorkload,
    TraceWorkload,
)
from workloads.schema import WorkloadConfig as _WorkloadConfig

UNION_TAGS = frozenset({"fixed", "roofline", "fitted"} | _WORKLOAD_TAGS | ROUTER_TAGS)
"""The tags of the config's tagged unions, which pydantic puts in an error's location."""


class _Strict(BaseModel):
    # allow_inf_nan=False: a float key takes finite numbers only (``step_time_s: .inf`` would run
    # and report TTFT = inf; ``kv_cache_gib: .inf`` would end in a traceback)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


STARTUP_CHECKS = "vllm_startup_checks"
"""Validation-context flag: apply the checks of vLLM's served-engine start-up that its bare
``Scheduler`` does not make (the attention backend's block-size rule)."""


def _backend_block_size(value: int, info: ValidationInfo) -> int:
    """vLLM 0.25.1's attention-backend rule (``sim.experiment.block_size_rule``), for configs read
    from files (``load_config``, ``load_sweep``: what ``vllm serve`` would start). A mapping given
    to :func:`config_from_dict` without the flag skips it: vLLM's own ``Scheduler``, driven
    directly (as ``tools/vllm_oracle`` does for ``tests/test_vllm_agreement.py``), accepts any size."""
    if info.context and info.context.get(STARTUP_CHECKS):
        check_block_size(value)
    return value


BlockSize = Annotated[int, Field(gt=0, le=4096), AfterValidator(_backend_block_size)]
"""A KV-cache block size; from a file, one vLLM 0.25.1 has an attention backend for."""


class KVCacheGroupConfig(_Strict):
    """One KV-cache group of a sliding-window or hybrid model (see ``sim.core.kv_cache_spec``)."""

    kind: Literal["full", "sliding_window"]
    block_size: BlockSize
    sliding_window: Annotated[int, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _window_matches_kind(self) -> KVCacheGroupConfig:
        if self.kind == "sliding_window" and self.sliding_window is None:
            raise ValueError("a sliding_window group needs sliding_window (tokens, > 0)")
        if self.kind == "full" and self.sliding_window is not None:
            raise ValueError("a full-attention group takes no sliding_window")
        return self


def _unset(value: Any) -> bool:
    return value is None


class EngineConfig(_Strict):
    """vLLM engine knobs (defaults: vLLM 0.25.1's LLM-class defaults on a >=70 GiB GPU, but
    ``max_num_batched_tokens`` 8192 / ``max_num_seqs`` 256, the API-server-like H100 setting);
    ``vllm_version``: the behaviour profile (``sim.experiment.version_keys``)."""

    vllm_version: str = DEFAULT_VERSION  # first: the version-only keys' validators read it
    block_size: BlockSize = 16
    num_gpu_blocks: Annotated[int, Field(ge=2)] | None = None
    kv_cache_gib: Annotated[float, Field(gt=0)] | None = None
    # a share of the pool vLLM would profile (0.5 halves it); no vLLM flag: --num-gpu-blocks-override of
    # that share. Left out of the resolved config when unset, so other configs keep their point keys
    kv_cache_fraction: Annotated[float, Field(gt=0, le=1)] | None = Field(default=None, exclude_if=_unset)
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.92
    max_num_batched_tokens: Annotated[int, Field(gt=0)] = 8192
    max_num_seqs: Annotated[int, Field(gt=0)] = 256
    max_model_len: Annotated[int, Field(gt=1)] | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: Annotated[int, Field(ge=0)] = 0
    policy: Literal["fcfs", "priority"] = "fcfs"
    watermark: Annotated[float, Field(ge=0, lt=1)] = 0.0
    scheduler_reserve_full_isl: bool = True
    enable_prefix_caching: bool = True
    hash_algo: Literal["fast", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"] = "fast"
    # vLLM's PYTHONHASHSEED; unset: see sim.experiment.version_keys.none_hash_seed
    hash_seed: int | None = Field(default=None, exclude_if=_unset)
    use_eagle: bool = False
    async_scheduling: bool = False  # vLLM's default is on; the simulator's default is the sync scheduler
    pool_impl: Literal["compiled", "python"] = "compiled"  # the block pool (sim.core.pool_impl); same results
    # Sliding-window / hybrid models: the KV-cache groups, in vLLM's group order. Unset = one
    # full-attention group of ``block_size``. When set, ``block_size`` is not used (the scheduler
    # block size is the LCM of the group sizes) and ``num_gpu_blocks`` is required (vLLM's hybrid
    # pool sizing is not modelled).
    kv_cache_groups: tuple[KVCacheGroupConfig, ...] | None = None
    hash_block_size: Annotated[int, Field(gt=0)] | None = None  # hybrid only; default: GCD of group sizes
    # vLLM 0.33.0 keys (sim.experiment.version_keys; left out of the resolved config when unset)
    prefix_match_unit: Annotated[int, Field(gt=0)] | None = Field(default=None, exclude_if=_unset)
    max_num_active_seqs: Annotated[int, Field(gt=0)] | None = Field(default=None, exclude_if=_unset)
    prefill_schedule_interval: Annotated[int, Field(ge=1)] | None = Field(default=None, exclude_if=_unset)

    _version = field_validator("vllm_version")(check_version)
    _version_keys = field_validator("hash_block_size", "prefix_match_unit", "max_num_active_seqs",
                                    "prefill_schedule_interval")(check_version_key)
    # vLLM 0.33.0's native CPU offload tier (sim.experiment.offload_tier, which says what each key mirrors);
    # left out of the resolved config when unset, so untiered configs keep their point keys
    kv_offloading_size: float | None = Field(default=None, exclude_if=_unset)  # GiB
    num_cpu_blocks: Annotated[int, Field(gt=0)] | None = Field(default=None, exclude_if=_unset)  # chunks
    kv_offloading_policy: Literal["lru", "arc"] | None = Field(default=None, exclude_if=_unset)  # default lru
    kv_offloading_block_size: Annotated[int, Field(gt=0)] | None = Field(default=None, exclude_if=_unset)
    offload_prompt_only: bool | None = Field(default=None, exclude_if=_unset)  # default true
    store_threshold: Annotated[int, Field(ge=0)] | None = Field(default=None, exclude_if=_unset)  # default 0
    offload_bandwidth_gb_s: Annotated[float, Field(gt=0)] | None = Field(default=None, exclude_if=_unset)
    offload_link_duplex: bool | None = Field(default=None, exclude_if=_unset)  # default true
    self_describing_kv_events: bool | None = Field(default=None, exclude_if=_unset)  # default false

    _offload_size = field_validator("kv_offloading_size")(check_offload_size)

    @model_validator(mode="after")
    def _offload_valid(self) -> EngineConfig:
        check_offload_keys(self)
        return self

    @model_validator(mode="after")
    def _kv_cache_groups_valid(self) -> EngineConfig:
        check_engine_keys(self)
        if self.kv_cache_groups is None:
            if self.hash_block_size is not None:
                raise ValueError("hash_block_size applies only with kv_cache_groups")
            return self
        if not self.kv_cache_groups:
            raise ValueError("kv_cache_groups must list at least one group (or be left unset)")
        check_groups(self.kv_cache_group_specs(), self.enable_prefix_caching, hash_unit(self))
        if self.num_gpu_blocks is None:
            raise ValueError("kv_cache_groups needs num_gpu_blocks (hybrid pool sizing is not modelled)")
        return self

    def kv_cache_group_specs(self) -> tuple[KVGroupSpec, ...]:
        """``kv_cache_groups`` as ``sim.core.kv_cache_spec.KVGroupSpec`` objects (empty when unset)."""
        return tuple(KVGroupSpec(g.kind, g.block_size, g.sliding_window) for g in self.kv_cache_groups or ())

    @model_validator(mode="after")
    def _one_capacity(self) -> EngineConfig:
        given = [k for k in ("num_gpu_blocks", "kv_cache_gib", "kv_cache_fraction") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError("set one of num_gpu_blocks or kv_cache_gib or kv_cache_fraction, "
                             f"not {' and '.join(given)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), as vLLM requires"
            )
        return self


class StepNoiseConfig(_Strict):
    """Step-time jitter (``sim.timing.step_noise``): each simulated step's duration times a mean-1
    lognormal factor, from its own stream (``seed``, default: the experiment seed). ``sigma``
    defaults to the real backend's measured run-to-run noise (the CPU reference); unset
    ``latency.noise`` = no jitter (durations exactly the latency model's)."""

    kind: Literal["lognormal"] = "lognormal"
    sigma: Annotated[float, Field(ge=0, le=2)] = DEFAULT_SIGMA
    seed: int | None = None


class _Latency(_Strict):
    # left out of the resolved config when unset, so configs without it keep their point keys
    noise: StepNoiseConfig | None = Field(default=None, exclude_if=_unset)


class FixedLatencyConfig(_Latency):
    kind: Literal["fixed"]
    step_time_s: Annotated[float, Field(gt=0)] = 0.01


class RooflineLatencyConfig(_Latency):
    kind: Literal["roofline"]
    overhead_s: Annotated[float, Field(ge=0)] | None = None


class FittedLatencyConfig(_Latency):
    kind: Literal["fitted"]
    path: str


LatencyConfig = Annotated[
    FixedLatencyConfig | RooflineLatencyConfig | FittedLatencyConfig, Field(discriminator="kind")
]


# The workload models (every ``kind`` and its keys) live in ``workloads.schema``.
WorkloadConfig = _WorkloadConfig


TableFormat = Literal["parquet", "csv"]


class ReplayConfig(_Strict):
    """How the replay runs and what it writes. ``tables``: the formats of ``requests`` and
    ``steps`` (parquet by default; ``[parquet, csv]`` or ``apcsim run --csv`` adds CSV).
    ``on_invalid_request``: ``reject`` (vLLM's behaviour: a prompt longer than ``max_model_len``,
    or a request that can never fit the pool, is rejected alone and the run goes on) or ``error``
    (the run stops at that request)."""

    fast_forward: bool = True
    progress: bool | Literal["auto"] = "auto"
    record_events: bool = False
    tables: Annotated[tuple[TableFormat, ...], Field(min_length=1)] = ("parquet",)
    on_invalid_request: Literal["reject", "error"] = "reject"
    # miss attribution (sim.replay.attribution): off; summary = per-request cause counts and their
    # sums; full = also one row per prompt block (blocks.parquet, for apcsim explain)
    attribution: Literal["off", "summary", "full"] = "off"

    @field_validator("attribution", mode="before")
    @classmethod
    def _attribution_bool(cls, v: Any) -> Any:
        # YAML reads a bare off / on as booleans
        return {False: "off", True: "summary"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _tables_unique(self) -> ReplayConfig:
        if len(set(self.tables)) != len(self.tables):
            raise ValueError(f"tables lists a format twice: {list(self.tables)}")
        return self


class BackendConfig(_Strict):
    """The real PyTorch backend, used only by ``apcsim run --backend torch`` (see ``gpu_backend``):
    model shape (``tiny``, a built-in model name or a YAML spec path), precision, device,
    attention path (``auto`` probes the fast CUDA paths and falls back to ``reference``), weight
    seed (default: the experiment seed), CPU threads, step timing (and how many times each step is
    run to take the median: a noise reduction for shared CPUs), and the per-step check that the
    executor's block tables equal the KV manager's."""

    model_shape: str = "tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Literal["cpu", "cuda"] = "cpu"
    attention: Literal["auto", "reference", "triton", "flash_paged", "flash_gather"] = "auto"
    seed: int | None = None
    num_threads: Annotated[int, Field(gt=0)] | None = None
    timing: Literal["wall", "cuda_events", "thread_cpu"] = "wall"
    timing_repeats: Annotated[int, Field(ge=1)] = 1  # a step's time: median of this many runs of it
    verify_block_tables: bool = True


class ExperimentConfig(_Strict):
    """One experiment: model on a GPU, engine knobs, latency model, workload, seed, output."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")]
    seed: int = 0
    output_dir: str = "results"
    model: str = "llama-3-8b"
    gpu: str = "H100-SXM"
    engine: EngineConfig = EngineConfig()
    latency: LatencyConfig = RooflineLatencyConfig(kind="roofline")
    workload: WorkloadConfig
    replay: ReplayConfig = ReplayConfig()
    backend: BackendConfig = BackendConfig()
    cluster: ClusterConfig | None = None  # N replicas behind a router (sim.experiment.cluster_run)
    # a timing side-channel experiment (``apcsim sidechannel``); left out of the resolved config when unset
    sidechannel: SideChannelConfig | None = Field(default=None, exclude_if=_unset)
    base_dir: str = Field(default=".", exclude=True)  # input paths resolve against this
    source: str = Field(default="<config>", exclude=True)  # the file, for error messages

    def resolve_path(self, p: str) -> Path:
        """An input path: absolute, or relative to the config file's directory."""
        return input_path(p, self.base_dir)

    def results_dir(self) -> Path:
        """``<output_dir>/<name>``; a relative ``output_dir`` is relative to the working directory."""
        return Path(self.output_dir).expanduser() / self.name


def config_from_dict(data: Any, source: str = "<config>", base_dir: str | Path = ".", *,
                     startup_checks: bool = False) -> ExperimentConfig:
    """Validate a mapping; errors name ``source`` and each bad key. ``startup_checks``: also the
    checks of vLLM's served-engine start-up (the block-size rule; on for config files)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    try:
        cfg = ExperimentConfig.model_validate({**data, "base_dir": str(base_dir), "source": source},
                                              context={STARTUP_CHECKS: startup_checks})
    except ValidationError as exc:
        lines = error_lines(source, exc.errors(), UNION_TAGS)
        raise ConfigError("\n".join(lines)) from None
    quoted = [f"{source}: {loc}: {problem}" for loc, problem in scalar_problems(data, cfg)]  # "8192", "yes"
    if quoted:
        raise ConfigError("\n".join(quoted[:MAX_LINES]))
    return cfg


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content, read strictly (``sim.experiment.strict_yaml``: a key given twice,
    bytes that are not UTF-8 and bad syntax are refused); problems raise ``ConfigError``
    ``file:line[:col]: problem``."""
    path = Path(path)
    try:
        return load_yaml_file(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    except YAMLInputError as exc:
        raise ConfigError(f"{path}:{exc}" if exc.where else f"{path}: {exc}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment YAML file."""
    path = Path(path)
    data = load_yaml(path)
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys")
        data = apply_overrides(data, overrides)
    try:
        return config_from_dict(data, str(path), path.parent, startup_checks=True)
    except ConfigError as exc:
        if not overrides:
            raise
        lines = [blame_override(ln, str(path), overrides) for ln in str(exc).splitlines()]
        raise ConfigError("\n".join(lines)) from None


def config_to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The resolved config as plain data (what is written beside results); a single-engine config
    has no ``cluster`` key, so its dump (and sweep point key) is what it was before clusters."""
    exclude = {"base_dir", "source"} | ({"cluster"} if cfg.cluster is None else set())
    return cfg.model_dump(mode="json", exclude=exclude)


assert set(HASH_ALGOS) == {"fast", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}
