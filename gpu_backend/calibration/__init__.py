"""Calibration: fitting the simulator's step-latency model on real forward passes (``apcsim calibrate``).

Mirrors nothing in vLLM (vLLM measures; apcsim predicts, and this is where the prediction is fitted).
The data path, in the order :mod:`~gpu_backend.calibration.calibrate` runs it:

1. what to time -- :mod:`~gpu_backend.calibration.calibration_setup` (the backend settings of a config)
   and :mod:`~gpu_backend.calibration.profiling_grid` (isolated step shapes);
2. timing -- :mod:`~gpu_backend.calibration.grid_timing` (grid points through the executor, with their
   noise floor) and :mod:`~gpu_backend.calibration.replay_samples` (every step of real calibration
   replays); :mod:`~gpu_backend.calibration.link_timing` times the CPU tier's block copies;
   :mod:`~gpu_backend.calibration.host` records where it ran;
3. fitting -- :mod:`~gpu_backend.calibration.latency_fit` (NNLS in relative error, terms chosen by
   cross-validation) and :mod:`~gpu_backend.calibration.fit_report` (per-term table, residuals);
4. the model file that ``sim.timing.fitted_latency`` reads.

Two studies refit or probe what the fit rests on: :mod:`~gpu_backend.calibration.fit_ablation`
(refits of a reference's own samples) and :mod:`~gpu_backend.calibration.step_cost_probe` (what a
step's cost depends on beyond its shape). Imports :mod:`gpu_backend.executor` and below; the
validation and device packages import this one, never the other way.
"""
