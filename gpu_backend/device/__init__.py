"""The device run: one script that takes the whole backend to a GPU and cannot waste the run.

``bash gpu_backend/device/device_run.sh`` (``--device cpu --quick`` runs the same sequence on a CPU)
goes through the floors below in order, each stage in its own process under its own timeout, its
results written the moment it ends:

* :mod:`~gpu_backend.device.preflight` -- what this machine has (packages, CUDA, memory, disk) and
  the plan that follows; imports nothing of ``gpu_backend``;
* :mod:`~gpu_backend.device.device_stages` -- one stage per process (correctness, long context,
  speed, the offload link, calibration, validation) and the files it writes;
* :mod:`~gpu_backend.device.device_checks` -- the measuring stages: the correctness suite of
  :mod:`gpu_backend.validation`, the long-context case, the speed figures;
* :mod:`~gpu_backend.device.bench` -- the speed benchmark's pieces, against the device's measured
  ceilings and datasheet peaks.

The top floor of ``gpu_backend``: it imports every package below, and nothing imports it.
"""
