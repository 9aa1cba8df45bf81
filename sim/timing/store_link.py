"""One replica's link to a fleet's shared KV store (mirrors nothing in vLLM's code: it is the network
under a store connector -- Mooncake Store's RDMA transfer engine, LMCache's remote backend -- as
:class:`~sim.timing.transfer_link.TransferLink` is the PCIe link under the CPU tier).

A :class:`StoreLink` is a full-duplex :class:`TransferLink` whose two directions have their own
bandwidth: loads (store -> GPU) at ``bandwidth_gb_s`` (``cluster.kv_store.read_gb_s``), stores
(GPU -> store) at ``write_gb_s``, each transfer paying ``latency_s`` once. Each direction is one
FIFO lane, so a load never queues behind a burst of stores and two loads of one replica cross one
after the other; every replica has its own link (the store's side is not a shared bottleneck here:
Mooncake Store stripes a block's replicas over many nodes' NICs).

Invariants: the base class's (completion times never decrease within a lane; a 0-byte transfer
costs ``latency_s``); ``write_gb_s`` > 0. Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.timing.transfer_link import TransferLink


@dataclass(slots=True)
class StoreLink(TransferLink):
    """A duplex link with a read bandwidth (``bandwidth_gb_s``) and a write bandwidth."""

    write_gb_s: float = 0.0

    def __post_init__(self) -> None:
        TransferLink.__post_init__(self)
        if not self.duplex:
            raise ValueError("a store link is full duplex (one lane per direction)")
        if not self.write_gb_s > 0:
            raise ValueError(f"store write bandwidth must be > 0 GB/s, got {self.write_gb_s}")

    def submit(self, now: float, num_bytes: int, *, load: bool) -> float:
        """Changes state: queue a load (read) or a store (write) of ``num_bytes`` at ``now`` on its
        own lane; returns when it completes."""
        free = self.load_free_at if load else self.store_free_at
        start = now if now > free else free
        bandwidth = self.bandwidth_gb_s if load else self.write_gb_s
        done = start + self.latency_s + num_bytes / (bandwidth * 1e9)
        if load:
            self.load_free_at = done
        else:
            self.store_free_at = done
        self.bytes_moved += num_bytes
        return done

    def write_seconds_for(self, num_bytes: int) -> float:
        """Query: how long a store of ``num_bytes`` takes on an idle lane."""
        return self.latency_s + num_bytes / (self.write_gb_s * 1e9)
