"""Experiment configuration (mirrors vLLM 0.25.1's engine arguments and their defaults): YAML
validated by pydantic models (unknown keys are errors).

``load_config(path)`` returns an :class:`ExperimentConfig` or raises :class:`ConfigError`, whose
message names the file and the offending key (``configs/x.yaml: engine.blok_size: unknown key``).
Input paths inside a config (traces, fitted latency files) are resolved against the config
file's directory; ``output_dir`` is relative to the working directory.
Invariants: every model is frozen and forbids unknown keys; a problem is one ``ConfigError``
line per bad key, ``file: key: problem``. Imports neither simpy nor torch.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from sim.core.errors import ApcsimError
from sim.core.hashing import HASH_ALGOS
from sim.core.kv_cache_spec import KVGroupSpec, check_groups
from sim.experiment.cluster_config import ROUTER_TAGS, ClusterConfig
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


class ConfigError(ApcsimError, ValueError):
    """A configuration problem; ``str()`` is ``file: key: problem``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KVCacheGroupConfig(_Strict):
    """One KV-cache group of a sliding-window or hybrid model (see ``sim.core.kv_cache_spec``)."""

    kind: Literal["full", "sliding_window"]
    block_size: Annotated[int, Field(gt=0, le=4096)]
    sliding_window: Annotated[int, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _window_matches_kind(self) -> KVCacheGroupConfig:
        if self.kind == "sliding_window" and self.sliding_window is None:
            raise ValueError("a sliding_window group needs sliding_window (tokens, > 0)")
        if self.kind == "full" and self.sliding_window is not None:
            raise ValueError("a full-attention group takes no sliding_window")
        return self


class EngineConfig(_Strict):
    """vLLM engine knobs (defaults: vLLM 0.25.1's LLM-class defaults on a >=70 GiB GPU, but
    ``max_num_batched_tokens`` 8192 / ``max_num_seqs`` 256, the API-server-like H100 setting)."""

    block_size: Annotated[int, Field(gt=0, le=4096)] = 16
    num_gpu_blocks: Annotated[int, Field(ge=2)] | None = None
    kv_cache_gib: Annotated[float, Field(gt=0)] | None = None
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
    hash_seed: int = 0
    use_eagle: bool = False
    async_scheduling: bool = False  # vLLM's default is on; the simulator's default is the sync scheduler
    # Sliding-window / hybrid models: the KV-cache groups, in vLLM's group order. Unset = one
    # full-attention group of ``block_size``. When set, ``block_size`` is not used (the scheduler
    # block size is the LCM of the group sizes) and ``num_gpu_blocks`` is required (vLLM's hybrid
    # pool sizing is not modelled).
    kv_cache_groups: tuple[KVCacheGroupConfig, ...] | None = None
    hash_block_size: Annotated[int, Field(gt=0)] | None = None  # hybrid only; default: GCD of group sizes

    @model_validator(mode="after")
    def _kv_cache_groups_valid(self) -> EngineConfig:
        if self.kv_cache_groups is None:
            if self.hash_block_size is not None:
                raise ValueError("hash_block_size applies only with kv_cache_groups")
            return self
        if not self.kv_cache_groups:
            raise ValueError("kv_cache_groups must list at least one group (or be left unset)")
        check_groups(self.kv_cache_group_specs(), self.enable_prefix_caching, self.hash_block_size)
        if self.num_gpu_blocks is None:
            raise ValueError("kv_cache_groups needs num_gpu_blocks (hybrid pool sizing is not modelled)")
        return self

    def kv_cache_group_specs(self) -> tuple[KVGroupSpec, ...]:
        """``kv_cache_groups`` as ``sim.core.kv_cache_spec.KVGroupSpec`` objects (empty when unset)."""
        return tuple(KVGroupSpec(g.kind, g.block_size, g.sliding_window) for g in self.kv_cache_groups or ())

    @model_validator(mode="after")
    def _one_capacity(self) -> EngineConfig:
        if self.num_gpu_blocks is not None and self.kv_cache_gib is not None:
            raise ValueError("set num_gpu_blocks or kv_cache_gib, not both")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), as vLLM requires"
            )
        return self


class FixedLatencyConfig(_Strict):
    kind: Literal["fixed"]
    step_time_s: Annotated[float, Field(gt=0)] = 0.01


class RooflineLatencyConfig(_Strict):
    kind: Literal["roofline"]
    overhead_s: Annotated[float, Field(ge=0)] | None = None


class FittedLatencyConfig(_Strict):
    kind: Literal["fitted"]
    path: str


LatencyConfig = Annotated[
    FixedLatencyConfig | RooflineLatencyConfig | FittedLatencyConfig, Field(discriminator="kind")
]


# The workload models (every ``kind`` and its keys) live in ``workloads.schema``.
WorkloadConfig = _WorkloadConfig


class ReplayConfig(_Strict):
    fast_forward: bool = True
    progress: bool | Literal["auto"] = "auto"
    record_events: bool = False


class BackendConfig(_Strict):
    """The real PyTorch backend, used only by ``apcsim run --backend torch`` (see ``gpu_backend``):
    model shape (``tiny``, a built-in model name or a YAML spec path), precision, device,
    attention path (``auto`` probes the fast CUDA paths and falls back to ``reference``), weight
    seed (default: the experiment seed), CPU threads, step timing, and the per-step check that the
    executor's block tables equal the KV manager's."""

    model_shape: str = "tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Literal["cpu", "cuda"] = "cpu"
    attention: Literal["auto", "reference", "triton", "flash_paged", "flash_gather"] = "auto"
    seed: int | None = None
    num_threads: Annotated[int, Field(gt=0)] | None = None
    timing: Literal["wall", "cuda_events"] = "wall"
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
    base_dir: str = Field(default=".", exclude=True)  # input paths resolve against this
    source: str = Field(default="<config>", exclude=True)  # the file, for error messages

    def resolve_path(self, p: str) -> Path:
        """An input path: absolute, or relative to the config file's directory."""
        return input_path(p, self.base_dir)

    def results_dir(self) -> Path:
        """``<output_dir>/<name>``; a relative ``output_dir`` is relative to the working directory."""
        return Path(self.output_dir).expanduser() / self.name


def _format_loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and p in _UNION_TAGS)]
    return ".".join(parts) or "<top level>"


_UNION_TAGS = {"fixed", "roofline", "fitted"} | _WORKLOAD_TAGS | ROUTER_TAGS


def _describe(err: ErrorDetails) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required key is missing"
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{msg} (got {err['input']!r})" if err["type"] != "value_error" else msg


def config_from_dict(data: Any, source: str = "<config>", base_dir: str | Path = ".") -> ExperimentConfig:
    """Validate a mapping; errors name ``source`` and each bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    try:
        return ExperimentConfig.model_validate({**data, "base_dir": str(base_dir), "source": source})
    except ValidationError as exc:
        lines = [f"{source}: {_format_loc(e['loc'])}: {_describe(e)}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a config mapping."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{source}: override {item!r} must look like key.path=value")
        try:
            set_dotted(data, key, yaml.safe_load(raw))
        except ConfigError as exc:
            raise ConfigError(f"{source}: override {item!r}: {exc}") from None
    return data


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested mapping, creating missing mappings (``value`` is copied)."""
    node = data
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])} is not a mapping")
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment YAML file."""
    path = Path(path)
    data = load_yaml(path)
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys")
        data = apply_overrides(data, overrides, str(path))
    return config_from_dict(data, str(path), path.parent)


def config_to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The resolved config as plain data (what is written beside results); a single-engine config
    has no ``cluster`` key, so its dump (and sweep point key) is what it was before clusters."""
    exclude = {"base_dir", "source"} | ({"cluster"} if cfg.cluster is None else set())
    return cfg.model_dump(mode="json", exclude=exclude)


assert set(HASH_ALGOS) == {"fast", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}
