"""Calibrating the CPU offload tier's link (issue 33 item 4): the fit of timed block copies, the
copies themselves on a CPU-only machine (host <-> host, labelled so), and how a calibration file's
``host_link`` reaches the engine description and the replay's link."""

from __future__ import annotations

import json

import pytest

from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.engine_description import resolve
from sim.experiment.kv_worker import build_kv_worker
from sim.timing.transfer_link import LinkFit


def test_fit_recovers_bandwidth_and_latency_exactly_from_noiseless_times() -> None:
    pytest.importorskip("scipy")
    from gpu_backend.calibration.link_timing import fit_link

    # 20 GB/s and 10 us: 1 MB takes 10 + 50 = 60 us, 4 MB 210 us, 16 MB 810 us
    sizes = [1e6, 4e6, 16e6]
    times = [60e-6, 210e-6, 810e-6]
    bw, lat = fit_link(sizes, times)
    assert bw == pytest.approx(20.0, rel=1e-9) and lat == pytest.approx(10e-6, rel=1e-9)
    # latency cannot go negative: times on a line through -20 us give a zero intercept
    bw, lat = fit_link([1e6, 2e6], [40e-6, 100e-6])
    assert lat == 0.0 and 20.0 <= bw <= 25.0  # between 2e6 B / 100 us = 20 and 1e6 B / 40 us = 25 GB/s
    with pytest.raises(ValueError, match="no per-byte cost"):
        fit_link([1e6, 2e6], [5e-6, 5e-6])


def test_cpu_only_measurement_is_host_to_host_and_labelled_so() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("scipy")
    from gpu_backend.calibration.link_timing import measure_link

    sec = measure_link("cpu", sizes=(1, 16, 2048), repeats=5, warmup=1, log=lambda *_: None)
    assert sec["measured"].startswith("host <-> host") and sec["pinned_host_memory"] is False
    assert sec["measured"].endswith("wall clock)") and sec["timing"] == "wall"
    assert sec["bytes_per_block"] == 4 * 2 * 16 * 2 * 64 * 4  # tiny: 4 layers, K and V, 16 x 2 heads x 64, fp32
    got = {(s["direction"], s["num_blocks"]): s for s in sec["samples"]}
    assert set(got) == {(d, n) for d in ("h2h_store", "h2h_load") for n in (1, 16, 2048)}
    assert all(s["num_bytes"] == s["num_blocks"] * sec["bytes_per_block"] and s["repeats"] == 5 for s in got.values())
    assert sec["bandwidth_gb_s"] > 0 and sec["latency_s"] >= 0 and set(sec["directions"]) == {"h2h_store", "h2h_load"}
    assert LinkFit.from_calibration(sec | {}, "x") is None  # the section itself is not a file
    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the thread's CPU time counts the copy only when it runs on this thread
        cpu = measure_link("cpu", sizes=(1, 2048), repeats=5, warmup=1, timing="thread_cpu", log=lambda *_: None)
        assert cpu["measured"].endswith("thread CPU time)") and cpu["timing"] == "thread_cpu"
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="one torch thread"):
            measure_link("cpu", sizes=(1, 256), repeats=1, warmup=0, timing="thread_cpu")
    finally:
        torch.set_num_threads(old)
    assert LinkFit.from_calibration({"host_link": sec}) == LinkFit(sec["bandwidth_gb_s"], sec["latency_s"],
                                                                  sec["measured"])


@pytest.mark.parametrize(("section", "key"), [({"bandwidth_gb_s": 0, "latency_s": 0}, "bandwidth_gb_s"),
                                              ({"bandwidth_gb_s": 5.0, "latency_s": -1e-6}, "latency_s"),
                                              ({"bandwidth_gb_s": "fast", "latency_s": 0}, "bandwidth_gb_s"),
                                              ({"latency_s": 0}, "bandwidth_gb_s")])
def test_a_bad_host_link_names_its_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=f"host_link.{key}"):
        LinkFit.from_calibration({"host_link": section}, "m.json")


def _cfg(tmp_path, link: dict[str, object] | None, **engine: object):  # type: ignore[no-untyped-def]
    model = {"kind": "fitted_linear", "features": {"intercept": 0.01}}
    if link is not None:
        model["host_link"] = link
    (tmp_path / "m.json").write_text(json.dumps(model))
    return config_from_dict({"name": "t", "model": "llama-3-8b", "gpu": "H100-SXM",
                             "engine": {"block_size": 16, "num_gpu_blocks": 9000, "max_model_len": 4096,
                                        "num_cpu_blocks": 100, **engine},
                             "latency": {"kind": "fitted", "path": "m.json"}, "workload": {"kind": "chat"}},
                            str(tmp_path / "t.yaml"), tmp_path)


def test_link_precedence_engine_key_then_calibration_then_gpu_spec(tmp_path) -> None:
    link = {"bandwidth_gb_s": 21.5, "latency_s": 3e-5, "measured": "pinned host <-> an H100"}
    d = resolve(_cfg(tmp_path, link))
    assert (d.offload_bandwidth_gb_s, d.offload_link_latency_s) == (21.5, 3e-5)
    assert d.offload_link_source == "calibration m.json (pinned host <-> an H100)"
    w = build_kv_worker(d)
    assert w is not None and (w.link.bandwidth_gb_s, w.link.latency_s) == (21.5, 3e-5)
    # 2 MiB per Llama-3-8B block: a 4-block load takes 30 us + 8,388,608 B / 21.5e9 B/s = 420.2 us
    assert w.link.seconds_for(4 * d.kv_bytes_per_block) == pytest.approx(3e-5 + 4 * 2**21 / 21.5e9)
    d = resolve(_cfg(tmp_path, link, offload_bandwidth_gb_s=40.0))
    assert (d.offload_bandwidth_gb_s, d.offload_link_latency_s, d.offload_link_source) == (
        40.0, 0.0, "engine.offload_bandwidth_gb_s")
    d = resolve(_cfg(tmp_path, None))
    assert (d.offload_bandwidth_gb_s, d.offload_link_latency_s, d.offload_link_source) == (55.0, 0.0, "gpu H100-SXM")
    assert resolve(_cfg(tmp_path, link, num_cpu_blocks=None)).offload_link_source == ""  # no tier, no link


def test_a_bad_calibrated_link_is_one_config_error_line(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"t\.yaml: latency\.path: .*m\.json: host_link\.latency_s"):
        resolve(_cfg(tmp_path, {"bandwidth_gb_s": 5.0, "latency_s": float("nan")}))
