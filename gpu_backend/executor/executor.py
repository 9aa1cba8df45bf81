"""``TorchExecutor``: the sim Scheduler's batches as real forward passes over a paged KV cache.

It implements the :class:`sim.core.executor.Executor` protocol: ``execute(SchedulerOutput) ->
StepResult(duration_s, sampled_token_ids)``. Per step it

1. updates its own per-request block tables from the output (:class:`~gpu_backend.layout.kv_cache.BlockTables`,
   vLLM's model-runner rules) and, when given the scheduler's ``KVCacheManager`` (``verify_with``),
   asserts they equal the manager's allocation;
2. flattens the scheduled prefill chunks and decodes into one batch (:func:`~gpu_backend.layout.batch.build_batch`)
   and runs the model over it, writing new K/V into the blocks the pool assigned;
3. computes logits for the last token of every request whose prefill completes (vLLM's
   ``logits_indices``) and returns, as the sampled token, the request's *planned* next token
   (teacher forcing), so the scheduler and the block hashes see exactly the tokens the simulator
   would; the real logits are kept per request when ``keep_logits`` is set (tests compare them with
   a dense recompute);
4. measures the step: wall clock around batch preparation + forward + logits, with
   ``torch.cuda.synchronize()`` on CUDA (``timing="wall"``, the default), or CUDA events around
   the device work only (``timing="cuda_events"``), or on a CPU with one torch thread the calling
   thread's CPU time (``timing="thread_cpu"``: ``time.thread_time()``, which leaves out the time
   the process spends descheduled while other processes run on a shared machine). With
   ``repeats`` > 1 the step runs that many times back to back and its duration is the median (a
   step is idempotent: the same K/V go into the same slots), a noise reduction for shared CPUs;
   the default is one run.

A step that schedules nothing (async scheduling, or a step that only preempts) updates the block
tables and returns zero seconds without a forward pass, as vLLM's model runner does.

With a CPU offload tier (``offload``: :class:`~gpu_backend.executor.offload_worker.TorchOffloadWorker`) the
step's connector metadata drives real block copies around the forward, empty steps included (vLLM
runs the connector for them too): stores and flushes, then loads, before it; the step's report
(``kv_output``: completed jobs, finished loads) after it. The measured step time is the forward's.

The executor has no ``decode_step_time``, so the replay's decode fast-forward is off: every step is
run for real.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Literal

import torch

from gpu_backend.attention.base import Attention
from gpu_backend.executor.model import LlamaModel
from gpu_backend.layout.batch import SeqInput, StepBatch, build_batch
from gpu_backend.layout.kv_cache import BlockTables, PagedKVCache
from sim.core.executor import StepResult, StepShape, step_shape

if TYPE_CHECKING:  # pragma: no cover
    from gpu_backend.executor.offload_worker import TorchOffloadWorker
    from sim.core.kv_cache_manager import KVCacheManager
    from sim.core.scheduler_output import SchedulerOutput
    from sim.core.transfer_job import KVConnectorOutput


def step_kind(output: SchedulerOutput) -> str:
    """``decode`` (only decodes), ``prefill`` (no decodes) or ``mixed``."""
    shape = step_shape(output)
    if shape.num_decode_seqs == shape.num_seqs:
        return "decode"
    return "prefill" if shape.num_decode_seqs == 0 else "mixed"


class TorchExecutor:
    """Runs each scheduled batch through ``model`` over ``cache`` with ``attention``."""

    def __init__(
        self,
        model: LlamaModel,
        cache: PagedKVCache,
        attention: Attention,
        *,
        verify_with: KVCacheManager | None = None,
        keep_logits: bool = False,
        timing: Literal["wall", "cuda_events", "thread_cpu"] = "wall",
        attention_report: dict[str, Any] | None = None,
        repeats: int = 1,
        offload: TorchOffloadWorker | None = None,
    ) -> None:
        if cache.num_kv_heads != model.num_kv_heads or cache.head_dim != model.head_dim:
            raise ValueError("cache and model disagree on KV heads / head_dim")
        if cache.num_layers != len(model.layers):
            raise ValueError("cache and model disagree on the number of layers")
        self.model = model
        self.cache = cache
        self.attention = attention
        self.verify_with = verify_with
        self.keep_logits = keep_logits
        if timing == "thread_cpu" and (cache.device.type != "cpu" or torch.get_num_threads() != 1):
            raise ValueError("timing 'thread_cpu' measures the calling thread's CPU time: it needs device cpu "
                             f"and one torch thread (device {cache.device.type}, {torch.get_num_threads()} threads)")
        self.timing = timing if cache.device.type == "cuda" or timing == "thread_cpu" else "wall"
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.repeats = repeats
        self.attention_report = attention_report or {"name": getattr(attention, "name", type(attention).__name__)}
        self.block_tables = BlockTables()
        self.offload = offload
        self.kv_output: KVConnectorOutput | None = None  # the offload worker's report of the last step
        self.kept_logits: dict[str, list[tuple[int, torch.Tensor]]] = defaultdict(list)
        self.step_log: list[tuple[int, str, int, int, float]] = []  # (step, kind, seqs, tokens, seconds)
        self.step_shapes: list[StepShape] = []  # the StepShape of each logged step (validation, per-step error)
        self.keep_inputs = False  # keep each logged step's inputs (re-timing, gpu_backend.executor.real_run)
        self.step_inputs: list[list[SeqInput]] = []

    # -- the Executor protocol ----------------------------------------------------------------
    def execute(self, output: SchedulerOutput) -> StepResult:
        self.block_tables.apply(output)
        offload = self.offload
        if offload is not None:
            offload.start_step(output.step, output.kv_connector_metadata)
            offload.order_forward(output)
        if self.verify_with is not None:
            if offload is None:
                self.block_tables.verify(self.verify_with)
            else:  # a request holding blocks for its load is met by the runner at admission
                self.block_tables.verify(self.verify_with, offload.awaiting_admission)
        if output.is_empty():
            # vLLM's model runner updates its state, then returns EMPTY_MODEL_RUNNER_OUTPUT without a
            # forward pass (GPUModelRunner.execute_model): no time, nothing logged
            if offload is not None:
                self.kv_output = offload.finish_step(output.step)
            return StepResult(0.0, {})
        seqs = []
        for s in output.scheduled:
            r = s.request
            c, n = s.num_computed_before, s.num_new_tokens
            seqs.append(SeqInput(r.request_id, r.token_slice(c, c + n), c, self.block_tables.tables[r.request_id],
                                 sample=bool(s.samples)))
        duration, batch, logits = self.run_timed(seqs)
        if self.repeats > 1:  # a step is idempotent (same K/V into the same slots, same logits)
            duration = statistics.median([duration, *(self.run_timed(seqs)[0] for _ in range(self.repeats - 1))])
        sampled: dict[str, list[int]] = {}
        for s in output.scheduled:
            if s.samples:
                r = s.request
                sampled[r.request_id] = [r.planned_output_token(len(r.output_token_ids))]
        if self.keep_logits and logits is not None:
            host = logits.float().cpu()
            for j, (rid, pos) in enumerate(zip(batch.sample_request_ids, batch.sample_positions)):
                self.kept_logits[rid].append((pos, host[j]))
        self.step_log.append((output.step, step_kind(output), len(seqs), batch.num_tokens, duration))
        self.step_shapes.append(step_shape(output))
        if self.keep_inputs:
            self.step_inputs.append(seqs)
        if offload is not None:
            self.kv_output = offload.finish_step(output.step)
        return StepResult(duration, sampled)

    def time_step(self, seqs: list[SeqInput]) -> float:
        """One step's duration as :meth:`execute` measures it (median of ``repeats`` runs), without
        touching the block tables or the logs: re-timing a step that already ran."""
        times = [self.run_timed(seqs)[0] for _ in range(self.repeats)]
        return times[0] if len(times) == 1 else statistics.median(times)

    def run_timed(self, seqs: list[SeqInput]) -> tuple[float, StepBatch, torch.Tensor | None]:
        """The measured part of a step: batch preparation + forward + logits of the sampling rows.

        Returns ``(seconds, batch, logits)``. The calibration (:mod:`gpu_backend.calibration.calibrate`) times
        its profiling shapes through this very method, so fitted and replayed step times measure the
        same code."""
        cuda = self.cache.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.cache.device)
        t0 = time.perf_counter()
        c0 = time.thread_time()
        if self.timing == "cuda_events":
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.inference_mode():
            batch = build_batch(seqs, block_size=self.cache.block_size, vocab_size=self.model.vocab_size,
                                device=self.cache.device)
            if self.timing == "cuda_events":
                ev0.record()
            hidden = self.model.forward(batch, self.cache, self.attention)
            logits = self.model.logits(hidden.index_select(0, batch.sample_rows)) if batch.sample_request_ids else None
            if self.timing == "cuda_events":
                ev1.record()
            if cuda:
                torch.cuda.synchronize(self.cache.device)
        duration = time.perf_counter() - t0
        if self.timing == "cuda_events":
            duration = ev0.elapsed_time(ev1) / 1e3
        elif self.timing == "thread_cpu":
            duration = time.thread_time() - c0
        return max(duration, 1e-9), batch, logits

    # -- reporting ----------------------------------------------------------------------------
    def step_time_summary(self) -> dict[str, dict[str, float]]:
        """Per step kind: count, total tokens, mean and p50 step seconds."""
        out: dict[str, dict[str, float]] = {}
        for kind in ("prefill", "mixed", "decode"):
            rows = [r for r in self.step_log if r[1] == kind]
            if not rows:
                continue
            times = sorted(r[4] for r in rows)
            out[kind] = {
                "steps": len(rows),
                "tokens": sum(r[3] for r in rows),
                "mean_s": sum(times) / len(times),
                "p50_s": times[len(times) // 2],
                "tokens_per_s": sum(r[3] for r in rows) / sum(times),
            }
        return out

    def describe(self) -> dict[str, Any]:
        """What ran: written to ``meta.json`` of a torch-backend run."""
        m, c = self.model, self.cache
        dev = c.device
        info: dict[str, Any] = {
            "backend": "torch",
            "torch": torch.__version__,
            "device": str(dev),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "num_threads": torch.get_num_threads() if dev.type == "cpu" else None,
            "model_shape": m.spec.name,
            "dtype": str(m.dtype).replace("torch.", ""),
            "num_parameters": m.num_parameters(),
            "kv_cache_bytes": c.nbytes,
            "num_blocks": c.num_blocks,
            "block_size": c.block_size,
            "attention": self.attention_report.get("name"),
            "attention_probes": self.attention_report.get("probes", {}),
            "timing": self.timing,
            "timing_repeats": self.repeats,
            "token_id_mapping": "token_id % vocab_size",
            "sampling": "teacher forcing (each request's planned next token)",
            "step_times": self.step_time_summary(),
        }
        if self.offload is not None:
            oc = self.offload.counters
            info["offload"] = {"num_loads": oc.num_loads, "num_stores": oc.num_stores, "load_bytes": oc.load_bytes,
                               "store_bytes": oc.store_bytes, "flushes": oc.flushes,
                               "pinned_host_memory": self.offload.store.pinned,
                               "copy_seconds": sum(t for _, _, t in oc.transfers)}
        return info
