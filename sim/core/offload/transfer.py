"""The connector's transfer shapes, re-exported from :mod:`sim.core.transfer_job` (where they live so
that ``sim.core.scheduler_output`` can carry them without importing this package)."""

from sim.core.transfer_job import KVConnectorMetadata, KVConnectorOutput, TransferJob

__all__ = ["KVConnectorMetadata", "KVConnectorOutput", "TransferJob"]
