"""From a validated ``workload:`` config section to a request stream (``build_workload``; mirrors
nothing in vLLM: what a load generator sends it).

A workload = a *source* (trace loader or generator) + an *arrival process* + optional *tenant /
salt / LoRA / prompt-logprobs* decoration + ``limit``, composed in that order:

1. the source yields requests in its own order -- request sources (``mooncake``, ``trace``,
   ``ragpulse``, ``azure``, ``rag``, ``synthetic_shared_prefix``) one by one, session sources
   (``chat``, ``agent``, ``agent_trace``) as sessions with session-relative arrivals;
2. the arrival process times them (``workloads.arrivals``): ``trace`` keeps a trace's timestamps
   (divided by ``rate_scale``); ``poisson`` / ``gamma`` / ``azure`` give request i (or session i's
   start) the i-th arrival; sessions are merged into one stream sorted by arrival;
3. ``tenants`` (if present) assigns tenant/user per session and applies the salt policy, LoRA and
   prompt-logprobs flags (``workloads.tenants``);
4. ``limit`` keeps the first requests of the merged stream.

Seeds: the workload ``seed`` (default: the experiment ``seed``) drives content; the arrival process
uses its own ``seed`` or a stream derived from the workload seed; tenants likewise. The same
config therefore yields the identical stream, and changing only the arrival rate leaves every
prompt unchanged. Nothing is materialised here: streams are lazy.

Input paths resolve against the config file's folder (``base_dir``). A setting that cannot be
built raises :class:`~workloads.errors.WorkloadConfigError` (``sim.experiment`` adds the file
name). Imports sim.core only (neither simpy nor torch).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workloads import arrivals as arr
from workloads.agent import agent_sessions
from workloads.agent_sessions import AgentTraceLoader, iter_sessions, session_files
from workloads.azure import azure_times, load_azure
from workloads.bailian import load_bailian
from workloads.chat import chat_sessions
from workloads.dists import rng_for
from workloads.errors import SkipLog, WorkloadConfigError
from workloads.hashed_trace import HashedTraceReader, trace_header
from workloads.mooncake import load_mooncake
from workloads.paths import input_path, shared_traces_dir
from workloads.rag import rag_requests
from workloads.ragpulse import load_ragpulse
from workloads.schema import PoissonArrivals, TraceArrivals, WorkloadConfig, generator_params
from workloads.synthetic import shared_prefix
from workloads.tenants import TenantModel
from workloads.trace_codecs import TraceInputError, check_trace_path
from workloads.trace_format import TraceRequest, read_trace
from workloads.trace_lines import open_trace

APPROXIMATE_NOTE = ("APPROXIMATE tokens: the trace was converted with the byte-level stand-in tokenizer "
                    "(apcsim convert --tokenizer approx); hit rates are approximate")

ARRIVAL_TAG = 100
"""Purpose tag of the arrival-process random stream (``rng_for(seed, ARRIVAL_TAG)``)."""


class SkipReport(Protocol):
    """Anything that counts skipped bad input (``TraceReader``, ``SkipLog``)."""

    skipped: int
    skipped_lines: list[Any]


Count = int | Callable[[], int] | None
"""A request count: known, deferred (a function, called only when a progress bar needs it), or
unknown."""


@dataclass
class Workload:
    """A request stream plus what is known about it up front."""

    requests: Iterable[TraceRequest]
    total: Count  # the request count, or a function counting it (called only for a progress bar)
    description: str
    reader: SkipReport | None = None  # to report skipped lines afterwards
    native_block_size: int | None = None  # the trace's own block size (finer replays: lower bound)
    notes: list[str] = field(default_factory=list)
    source: Any = None  # the loader object, for source-specific facts (stats)
    summary_notes: list[str] = field(default_factory=list)  # facts every summary of a replay shows
    executor_info: dict[str, Any] | None = None  # set by sim.experiment.run when the executor describes itself


@dataclass
class _Source:
    stream: Iterable[Any]
    sessions: bool
    total: Count
    description: str
    reader: SkipReport | None = None
    native_block_size: int | None = None
    timestamps: bool = True  # has its own arrival times
    default_arrival: Any = None
    notes: list[str] = field(default_factory=list)
    loader: Any = None
    multiple_of: int | None = None  # replays only at block sizes that are multiples of this (hashed traces)
    summary_notes: list[str] = field(default_factory=list)


def _path(base_dir: Path, given: str | None, default: Path, *, folder: bool = False) -> Path:
    p = input_path(given, base_dir) if given else default
    if not folder and p.is_dir():
        raise WorkloadConfigError("path", f"{p} is a directory; this workload reads one trace file")
    if not folder and p.exists() and not p.is_file():  # a FIFO or device is not "no such file"
        try:
            check_trace_path(p)
        except TraceInputError as exc:
            raise WorkloadConfigError("path", str(exc)) from None
    if not (p.is_dir() if folder else p.is_file()):
        raise WorkloadConfigError("path", f"no such {'folder' if folder else 'file'} {p}")
    return p


def _count_lines(path: Path, start: int = 0, limit: int | None = None, header: int = 0) -> int:
    with open_trace(path) as f:
        n = sum(1 for line in f if line.strip()) - header
    n = max(0, n - start)
    return n if limit is None else min(n, limit)


def _line_count(path: Path, start: int = 0, limit: int | None = None, header: int = 0) -> Callable[[], int]:
    """A deferred :func:`_count_lines`: reading a 500 MB trace twice costs seconds, and the count
    only feeds a progress bar."""
    return functools.partial(_count_lines, path, start, limit, header)


def _capped(total: Count, limit: int) -> Count:
    if total is None:
        return limit
    if callable(total):
        count = total
        return lambda: min(count() or 0, limit)
    return min(total, limit)


def _lower_bound_note(native: int) -> str:
    return (f"trace block size {native}: hit rates at smaller block sizes are a lower bound "
            "(distinct trace ids may share leading tokens)")


# -- sources ----------------------------------------------------------------------------------
def _mooncake(w: Any, seed: int, base_dir: Path) -> _Source:
    path = _path(base_dir, w.path, shared_traces_dir() / "mooncake" / "conversation_trace.jsonl")
    log = SkipLog()
    reqs = load_mooncake(path, tokens_per_id=w.tokens_per_id, time_scale=w.time_scale, start=w.start,
                         limit=w.limit, max_output_tokens=w.max_output_tokens,
                         skip_bad_lines=w.skip_bad_lines, skip_log=log, allow_empty=w.allow_empty)
    end = "" if w.limit is None else w.start + w.limit
    return _Source(reqs, False, _line_count(path, w.start, w.limit), f"mooncake {path.name} [{w.start}:{end}]",
                   log, w.tokens_per_id, notes=[_lower_bound_note(w.tokens_per_id)], loader=path)


def _trace(w: Any, seed: int, base_dir: Path) -> _Source:
    path = _path(base_dir, w.path, Path())
    header = trace_header(path) or {}  # written by apcsim convert / anonymize (workloads.convert, hashed_trace)
    count = _line_count(path, header=1 if header else 0)
    notes = [APPROXIMATE_NOTE] if header.get("approximate") else []
    stamped = header.get("timestamps", "epoch") != "none"
    mark = (" [APPROXIMATE tokens]" if notes else "") + ("" if stamped else " (no timestamps)")
    if not stamped:
        notes.append("the trace has no timestamps: the config's arrival process places its requests")
    if header.get("kind") == "hashed":
        hashed = HashedTraceReader(path, header, skip_bad_lines=w.skip_bad_lines, allow_empty=w.allow_empty)
        return _Source(hashed, False, count, f"hashed trace {path.name} (block size {hashed.block_size}){mark}",
                       hashed, hashed.block_size, timestamps=stamped, notes=notes, multiple_of=hashed.block_size,
                       summary_notes=list(notes))
    reader = read_trace(path, skip_bad_lines=w.skip_bad_lines, allow_empty=w.allow_empty)
    return _Source(reader, False, count, f"trace {path.name}{mark}", reader, timestamps=stamped, notes=notes,
                   summary_notes=list(notes))


def _bailian(w: Any, seed: int, base_dir: Path) -> _Source:
    path = _path(base_dir, w.path, Path())
    log = SkipLog()
    reqs = load_bailian(path, tokens_per_id=w.tokens_per_id, time_scale=w.time_scale, limit=w.limit,
                        max_output_tokens=w.max_output_tokens, type_as_tenant=w.type_as_tenant,
                        skip_bad_lines=w.skip_bad_lines, skip_log=log, allow_empty=w.allow_empty)
    return _Source(reqs, False, _line_count(path, 0, w.limit), f"bailian {path.name}", log, w.tokens_per_id,
                   notes=[_lower_bound_note(w.tokens_per_id)], loader=path)


def _ragpulse(w: Any, seed: int, base_dir: Path) -> _Source:
    folder = _path(base_dir, w.path, shared_traces_dir() / "ragpulse", folder=True)
    log = SkipLog(with_file=True)
    reqs = list(load_ragpulse(folder, limit=w.limit, max_output_tokens=w.max_output_tokens,
                              skip_bad_lines=w.skip_bad_lines, skip_log=log))
    return _Source(reqs, False, len(reqs), f"ragpulse {folder.name} ({len(reqs)} requests, timestamp order)", log,
                   notes=["RAGPulse components expand to their exact lengths: exact at every block size, "
                          "assuming distinct component ids are distinct content"])


def _agent_trace(w: Any, seed: int, base_dir: Path) -> _Source:
    folder = _path(base_dir, w.path, shared_traces_dir() / "weka_agent_sample", folder=True)
    n = len(session_files(folder)[: w.sessions])
    loader = AgentTraceLoader(w.shared_prompt_fraction, w.max_output_tokens, w.skip_bad_lines)
    return _Source(iter_sessions(folder, loader, w.sessions), True, None,
                   f"agent_trace {folder.name} ({n} sessions, shared prompt fraction {w.shared_prompt_fraction})",
                   loader.log, 64, timestamps=False, default_arrival=PoissonArrivals(kind="poisson", rate=0.01),
                   notes=[_lower_bound_note(64)], loader=loader)


def _azure(w: Any, seed: int, base_dir: Path) -> _Source:
    path = _path(base_dir, w.path, _azure_default(w.trace))
    log = SkipLog()
    reqs = load_azure(path, limit=w.limit, max_output_tokens=w.max_output_tokens,
                      skip_bad_lines=w.skip_bad_lines, skip_log=log)
    return _Source(reqs, False, _line_count(path, 0, w.limit, header=1), f"azure {path.name} (unique prompts)", log,
                   notes=["Azure 2023 has no content information: every prompt is unique (no hits possible)"])


def _shared_prefix(w: Any, seed: int, base_dir: Path) -> _Source:
    reqs = shared_prefix(w.num_requests, num_prefixes=w.num_prefixes, prefix_tokens=w.prefix_tokens,
                         suffix_tokens=w.suffix_tokens, output_tokens=w.output_tokens, rate=w.rate,
                         zipf=w.zipf, seed=seed, suffixes_per_prefix=w.suffixes_per_prefix)
    return _Source(reqs, False, len(reqs), f"synthetic shared-prefix x{w.num_requests}")


def _rag(w: Any, seed: int, base_dir: Path) -> _Source:
    p = generator_params(w)
    return _Source(rag_requests(p, seed), False, p.requests, f"rag x{p.requests} (corpus {p.corpus_size}, "
                   f"top-{p.top_k}, zipf {p.zipf}, {p.doc_order} order)", timestamps=False,
                   default_arrival=PoissonArrivals(kind="poisson", rate=2.0))


def _chat(w: Any, seed: int, base_dir: Path) -> _Source:
    p = generator_params(w)
    return _Source(chat_sessions(p, seed), True, None, f"chat x{p.sessions} sessions", timestamps=False,
                   default_arrival=PoissonArrivals(kind="poisson", rate=0.2))


def _agent(w: Any, seed: int, base_dir: Path) -> _Source:
    p = generator_params(w)
    return _Source(agent_sessions(p, seed), True, None, f"agent x{p.sessions} sessions", timestamps=False,
                   default_arrival=PoissonArrivals(kind="poisson", rate=0.02))


SOURCES: dict[str, Callable[[Any, int, Path], _Source]] = {
    "mooncake": _mooncake, "bailian": _bailian, "trace": _trace, "ragpulse": _ragpulse, "agent_trace": _agent_trace,
    "azure": _azure, "synthetic_shared_prefix": _shared_prefix, "rag": _rag, "chat": _chat, "agent": _agent,
}


def _azure_default(trace: str) -> Path:
    return shared_traces_dir() / "azure_llm_2023" / f"AzureLLMInferenceTrace_{trace}.csv"


# -- composition ------------------------------------------------------------------------------
def _times(spec: Any, seed: int, base_dir: Path) -> Iterator[float]:
    if spec.kind == "azure":
        path = _path(base_dir, spec.path, _azure_default(spec.trace))
        times = arr.cycled(azure_times(path, skip_bad_lines=spec.skip_bad_lines))
    else:
        rng = rng_for(spec.seed if spec.seed is not None else seed, ARRIVAL_TAG)
        times = arr.poisson(spec.rate, rng) if spec.kind == "poisson" else arr.gamma(spec.rate, spec.cv, rng)
    return arr.scaled(times, spec.rate_scale)


def build_workload(
    w: WorkloadConfig, *, seed: int, base_dir: str | Path = ".", block_size: int | None = None
) -> Workload:
    """The workload of the ``workload:`` section ``w`` (see the module docstring). ``seed`` is the
    experiment seed (used unless ``w.seed`` is set); ``block_size``, the scheduler block size,
    only adds the note that hits finer than the trace's own block size are a lower bound.
    Raises :class:`~workloads.errors.WorkloadConfigError`."""
    base = Path(base_dir)
    seed = w.seed if w.seed is not None else seed
    src = SOURCES[w.kind](w, seed, base)
    spec = w.arrival or src.default_arrival or TraceArrivals(kind="trace")
    if spec.kind == "trace":
        if not src.timestamps:
            raise WorkloadConfigError("arrival.kind", f"'trace' needs a source with timestamps; {src.description} "
                                                      "has none: set workload.arrival, e.g. {kind: poisson, rate: 2}")
        stream: Iterable[TraceRequest] = arr.scale_arrivals(src.stream, spec.rate_scale)
        desc = "trace timestamps" + (f" / {spec.rate_scale}" if spec.rate_scale != 1.0 else "")
    else:
        times = _times(spec, seed, base)
        stream = arr.merge_sessions(src.stream, times) if src.sessions else arr.retime(src.stream, times)
        desc = f"{spec.kind} arrivals" + (f" x{spec.rate_scale}" if spec.rate_scale != 1.0 else "")
    t = w.tenants
    if t is not None:
        model = TenantModel(t.num_tenants, t.tenant_skew, t.users_per_tenant, t.user_skew, t.salt,
                            t.lora_adapters, t.prompt_logprobs_fraction, t.seed if t.seed is not None else seed,
                            assign_by=t.assign_by)
        stream = model.decorate(stream)
        desc += f", {t.num_tenants} tenant(s), salt {t.salt}"
    native = src.native_block_size
    if src.multiple_of is not None and block_size is not None and block_size % src.multiple_of:
        raise WorkloadConfigError("path", f"a hashed trace at block size {src.multiple_of} replays at that block "
                                          f"size or a multiple of it, not at {block_size}: which tokens inside a "
                                          "block are shared is not in it")
    if native is not None and block_size is not None and block_size < native:
        desc += (f"; block size {block_size} < trace block size {native}: "
                 "hit rates are a lower bound")
    total = src.total
    if w.limit is not None:
        stream = itertools.islice(stream, w.limit)
        total = _capped(total, w.limit)
    return Workload(stream, total, f"{src.description}; {desc}", src.reader, src.native_block_size,
                    src.notes, src.loader, summary_notes=src.summary_notes)
