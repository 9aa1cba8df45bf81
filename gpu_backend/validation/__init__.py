"""Validation: is the backend right, and is the fitted latency model right?

Two questions, each checked against an independent answer:

* **correctness** (reuse equals recompute, the point of APC): :mod:`~gpu_backend.validation.cases`
  drives the real sim Scheduler and compares every logit vector with a dense recompute;
  :mod:`~gpu_backend.validation.cases_long` (32k-token context) and
  :mod:`~gpu_backend.validation.cases_offload` (prefixes loaded back from the CPU tier) extend it;
* **latency** (``apcsim validate``): :mod:`~gpu_backend.validation.validate` replays one config
  simulated (the calibrated model) and real (:mod:`gpu_backend.executor.real_run`), and reports the
  per-request error -- :mod:`~gpu_backend.validation.latency_error` (MAPE, percentile errors, noise
  floor), :mod:`~gpu_backend.validation.validation_report` (report.md),
  :mod:`~gpu_backend.validation.validation_plots` (scatter, CDF), :mod:`~gpu_backend.validation.rescore`
  (a report scored again from its own pairs);
* the measurements' **noise**: :mod:`~gpu_backend.validation.noise_study` /
  :mod:`~gpu_backend.validation.noise_report` (where the CPU timing noise comes from), and
  :mod:`~gpu_backend.validation.cpu_reference` (the committed CPU reference: calibration and
  validation interleaved in one time window).

Imports :mod:`gpu_backend.calibration` and below; only :mod:`gpu_backend.device` imports this package.
"""
