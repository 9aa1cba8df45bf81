"""The decode fast-forward's compiled step price (``sim.core.step_price``) equals the roofline's
``step_time`` bit for bit, and the executor offers it only where that holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.executor import StepShape
from sim.timing.latency import FixedLatency
from sim.timing.roofline import RooflineLatency, list_gpu_specs, list_model_specs
from sim.timing.simulated_executor import SimulatedExecutor
from sim.timing.step_noise import StepNoise

_MODELS = list_model_specs()
_GPUS = list_gpu_specs()


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(_MODELS),
    gpu=st.sampled_from(_GPUS),
    overhead=st.one_of(st.none(), st.floats(0.0, 0.05)),
    seqs=st.integers(1, 1024),
    new=st.integers(1, 1 << 16),
    prefill=st.integers(0, 1 << 16),
    context=st.integers(0, 1 << 40),
    pairs=st.integers(0, 1 << 60),  # beyond 2**53: an int rounds to its nearest double either way
)
def test_step_price_equals_the_roofline_exactly(model: str, gpu: str, overhead: float | None, seqs: int,
                                                new: int, prefill: int, context: int, pairs: int) -> None:
    latency = RooflineLatency.from_names(model, gpu, overhead)
    shape = StepShape(seqs, min(seqs, new), new, min(prefill, new), context, pairs)
    price = latency.step_price().step_time(seqs, new, context, pairs)
    assert price == latency.step_time(shape)  # the same double, not an approximation
    assert price.hex() == latency.step_time(shape).hex()


def test_the_executor_offers_the_compiled_price_for_the_plain_roofline_only() -> None:
    roofline = RooflineLatency.from_names(_MODELS[0], _GPUS[0])
    assert SimulatedExecutor(roofline).step_price is not None
    assert SimulatedExecutor(roofline, StepNoise(0.1, 7)).step_price is None  # jitter: priced per step
    assert SimulatedExecutor(FixedLatency(0.01)).step_price is None

    class Slower(RooflineLatency):
        def step_time(self, shape: StepShape) -> float:
            return 2 * super().step_time(shape)

    assert SimulatedExecutor(Slower.from_names(_MODELS[0], _GPUS[0])).step_price is None
