"""Latency models: spec loading, KV-cache budget, roofline and fitted linear models."""

from __future__ import annotations

import json

import pytest

from sim.core.executor import StepShape
from sim.timing.fitted_latency import FEATURES, MIN_STEP_TIME_S, FittedLatency
from sim.timing.latency import FixedLatency, LatencyModel
from sim.timing.roofline import (
    GPUSpec,
    ModelSpec,
    RooflineLatency,
    kv_cache_blocks,
    list_gpu_specs,
    list_model_specs,
    load_gpu_spec,
    load_model_spec,
)


@pytest.fixture(scope="module")
def llama8b() -> ModelSpec:
    return load_model_spec("llama-3-8b")


@pytest.fixture(scope="module")
def h100() -> GPUSpec:
    return load_gpu_spec("H100-SXM")


# ----------------------------------------------------------------------------- specs


def test_llama3_8b_shapes(llama8b: ModelSpec) -> None:
    assert llama8b.kv_bytes_per_token == 131072
    assert llama8b.kv_bytes_per_block(16) == 16 * 131072
    assert llama8b.num_params == pytest.approx(8.03e9, rel=0.02)
    assert llama8b.weight_bytes == 2 * llama8b.num_params
    assert llama8b.dense_flops_per_token == 2 * llama8b.non_embedding_params
    assert llama8b.flops_per_token == llama8b.dense_flops_per_token + 2 * 128256 * 4096


@pytest.mark.parametrize(
    "name, params",
    [("llama-3-70b", 70.6e9), ("qwen2.5-7b", 7.61e9), ("mistral-7b", 7.25e9), ("llama-3.2-1b", 1.24e9)],
)
def test_published_param_counts(name: str, params: float) -> None:
    assert load_model_spec(name).num_params == pytest.approx(params, rel=0.02)


def test_all_builtin_specs_load() -> None:
    assert {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mistral-7b"} <= set(list_model_specs())
    assert {"H100-SXM", "H200", "A100-80GB", "L40S"} <= set(list_gpu_specs())
    for name in list_model_specs():
        assert load_model_spec(name).name == name
    for name in list_gpu_specs():
        assert load_gpu_spec(name).name == name


def test_gpu_datasheet_values() -> None:
    h100, h200 = load_gpu_spec("H100-SXM"), load_gpu_spec("h200")
    assert (h100.memory_gib, h100.hbm_bandwidth_tbps, h100.bf16_tflops) == (80, 3.35, 989)
    assert (h200.memory_gib, h200.hbm_bandwidth_tbps, h200.bf16_tflops) == (141, 4.8, 989)
    assert 0 < h100.mfu_prefill <= 1 and 0 < h100.mbu_decode <= 1 and h100.step_overhead_s > 0


def test_hf_id_alias() -> None:
    assert load_model_spec("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3-8b"


def test_unknown_names_error_clearly() -> None:
    with pytest.raises(ValueError, match=r"unknown model spec 'gpt-9'.*llama-3-8b"):
        load_model_spec("gpt-9")
    with pytest.raises(ValueError, match=r"unknown gpu spec 'B900'.*H100-SXM"):
        load_gpu_spec("B900")


def test_user_yaml_files(tmp_path, llama8b: ModelSpec) -> None:
    single = tmp_path / "tiny.yaml"
    single.write_text(
        "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nnum_kv_heads: 2\nhead_dim: 16\n"
        "intermediate_size: 128\nvocab_size: 1000\nmax_model_len: 512\n"
    )
    tiny = load_model_spec(str(single))
    assert tiny.name == "tiny" and tiny.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2

    several = tmp_path / "gpus.yaml"
    several.write_text("X1: {memory_gib: 24, hbm_bandwidth_tbps: 1, bf16_tflops: 100}\n"
                       "X2: {memory_gib: 48, hbm_bandwidth_tbps: 2, bf16_tflops: 200}\n")
    assert load_gpu_spec(f"{several}#X2").memory_gib == 48
    with pytest.raises(ValueError, match="several"):
        load_gpu_spec(str(several))

    bad = tmp_path / "bad.yaml"
    bad.write_text("memory_gib: 24\nhbm_bandwidth_tbps: 1\nbf16_tflop: 100\n")
    with pytest.raises(ValueError, match="bf16_tflop"):
        load_gpu_spec(str(bad))


# ----------------------------------------------------------------------------- KV budget


def test_kv_cache_blocks_h100_llama8b(llama8b: ModelSpec, h100: GPUSpec) -> None:
    n = kv_cache_blocks(llama8b, h100, 16)
    assert 25_000 <= n <= 32_000
    assert kv_cache_blocks(llama8b, h100, 16, gpu_memory_utilization=0.5) < n
    assert kv_cache_blocks("llama-3-8b", "H100-SXM", 32) == pytest.approx(n / 2, abs=1)
    assert kv_cache_blocks(llama8b, h100, 16, kv_cache_gib=10) == 10 * 2**30 // (16 * 131072)


def test_kv_cache_blocks_impossible(llama8b: ModelSpec, h100: GPUSpec) -> None:
    with pytest.raises(ValueError, match="llama-3-70b"):
        kv_cache_blocks(load_model_spec("llama-3-70b"), h100, 16)
    with pytest.raises(ValueError, match="no room"):
        kv_cache_blocks(llama8b, h100, 16, gpu_memory_utilization=0.2)
    with pytest.raises(ValueError):
        kv_cache_blocks(llama8b, h100, 16, kv_cache_gib=0.001)


# ----------------------------------------------------------------------------- roofline


def test_roofline_is_a_latency_model(llama8b: ModelSpec, h100: GPUSpec) -> None:
    r = RooflineLatency(llama8b, h100)
    assert isinstance(r, LatencyModel) and r.name == "roofline"
    d = r.describe()
    assert d["name"] == "roofline" and d["overhead_s"] == h100.step_overhead_s
    assert d["model"]["num_layers"] == 32 and d["gpu"]["bf16_tflops"] == 989
    json.dumps(d)  # writable beside results
    assert RooflineLatency(llama8b, h100, overhead_s=0.0).overhead_s == 0.0


def test_roofline_monotone(llama8b: ModelSpec, h100: GPUSpec) -> None:
    r = RooflineLatency(llama8b, h100)
    prefill = [r.step_time(StepShape.prefill_only(n)) for n in (1, 64, 512, 2048, 8192, 16384)]
    assert prefill == sorted(prefill) and prefill[-1] > prefill[0]
    decode = [r.step_time(StepShape.decode_only(8, 8 * c)) for c in (0, 1024, 8192, 65536)]
    assert decode == sorted(decode) and decode[-1] > decode[0]
    by_batch = [r.step_time(StepShape.decode_only(b, b * 1024)) for b in (1, 16, 64, 256, 1024)]
    assert by_batch == sorted(by_batch)
    cached = [r.step_time(StepShape.prefill_only(2048, c)) for c in (0, 4096, 32768)]
    assert cached == sorted(cached) and cached[-1] > cached[0]


def test_roofline_regimes(llama8b: ModelSpec, h100: GPUSpec) -> None:
    r = RooflineLatency(llama8b, h100)
    decode = StepShape.decode_only(1, 1024)
    assert r.memory_time(decode) > 10 * r.compute_time(decode)
    prefill = StepShape.prefill_only(8192)
    assert r.compute_time(prefill) > 10 * r.memory_time(prefill)


def test_roofline_sanity_numbers(llama8b: ModelSpec, h100: GPUSpec) -> None:
    r = RooflineLatency(llama8b, h100)
    decode = r.step_time(StepShape.decode_only(1, 1024)) - r.overhead_s
    assert decode == pytest.approx(16e9 / (3.35e12 * 0.8), rel=0.30)  # ~6 ms
    prefill = r.step_time(StepShape.prefill_only(8192)) - r.overhead_s
    assert prefill == pytest.approx(2 * 7.5e9 * 8192 / (989e12 * 0.6), rel=0.30)  # ~0.2 s


def test_h200_decodes_faster_prefills_same(llama8b: ModelSpec, h100: GPUSpec) -> None:
    a, b = RooflineLatency(llama8b, h100), RooflineLatency(llama8b, load_gpu_spec("H200"))
    dec = StepShape.decode_only(32, 32 * 2048)
    assert b.step_time(dec) < a.step_time(dec)
    pre = StepShape.prefill_only(8192)
    assert b.step_time(pre) == pytest.approx(a.step_time(pre))


# ----------------------------------------------------------------------------- fitted


def _shape() -> StepShape:
    # 3 decodes at contexts 100, 200, 300 plus one 50-token prefill chunk after 1000 cached tokens.
    pairs = (101 + 201 + 301) + (50 * 1000 + 50 * 51 // 2)
    return StepShape(num_seqs=4, num_decode_seqs=3, num_new_tokens=53, num_prefill_tokens=50,
                     context_tokens=1600, attention_pairs=pairs)


def test_feature_vector_order() -> None:
    s = _shape()
    vec = FittedLatency.feature_vector(s)
    assert len(vec) == len(FEATURES) == len(FittedLatency.FEATURES)
    expected = {"intercept": 1.0, "num_prefill_seqs": s.num_prefill_seqs,
                "num_decode_tokens": s.num_decode_tokens, "kv_read_tokens": s.kv_read_tokens,
                "mixed_step": 1.0,  # 3 decodes and a prefill chunk in one step
                "multi_token_step": 1.0}  # 53 tokens
    for f in FEATURES:
        assert vec[FEATURES.index(f)] == expected.get(f, getattr(s, f, None))


def test_mixed_step_term_costs_only_steps_that_mix() -> None:
    m = FittedLatency({"intercept": 1e-3, "mixed_step": 5e-4})
    assert m.step_time(_shape()) == pytest.approx(1.5e-3)  # decodes + a prefill chunk
    assert m.step_time(StepShape.decode_only(4, 400)) == pytest.approx(1e-3)
    assert m.step_time(StepShape.prefill_only(64, 32)) == pytest.approx(1e-3)
    assert FittedLatency.feature_value("mixed_step", StepShape.decode_only(2, 10)) == 0.0
    assert FittedLatency.from_dict(m.to_dict()).coefs == m.coefs


def test_multi_token_step_term_costs_only_steps_of_more_than_one_token() -> None:
    m = FittedLatency({"intercept": 1e-3, "num_seqs": 1e-4, "multi_token_step": 3e-4})
    assert m.step_time(StepShape.decode_only(1, 400)) == pytest.approx(1.1e-3)  # one decode: a GEMV
    assert m.step_time(StepShape.decode_only(2, 400)) == pytest.approx(1.5e-3)  # two rows: a GEMM
    assert m.step_time(StepShape.decode_only(5, 400)) == pytest.approx(1.8e-3)
    assert m.step_time(StepShape.prefill_only(64, 32)) == pytest.approx(1.4e-3)
    assert m.step_time(StepShape.prefill_only(1, 32)) == pytest.approx(1.1e-3)  # a one-token prefill chunk
    assert FittedLatency.feature_value("multi_token_step", StepShape.decode_only(1, 10)) == 0.0
    assert FittedLatency.feature_value("multi_token_step", StepShape.decode_only(3, 10)) == 1.0
    assert FittedLatency.from_dict(m.to_dict()).coefs == m.coefs
    plain = FittedLatency({"intercept": 1e-3, "num_seqs": 1e-4})  # files without the term read as before
    assert plain.step_time(StepShape.decode_only(2, 400)) == pytest.approx(1.2e-3)


def test_fitted_hand_computed_value() -> None:
    coefs = {"intercept": 0.004, "num_new_tokens": 2e-5, "num_prefill_seqs": 1e-4,
             "num_decode_tokens": 3e-5, "kv_read_tokens": 1e-8, "attention_pairs": 1e-10}
    m = FittedLatency(coefs, {"device": "test"})
    s = _shape()  # new 53, prefill seqs 1, decode tokens 3, kv_read 1653, pairs 51_878
    expected = 0.004 + 2e-5 * 53 + 1e-4 * 1 + 3e-5 * 3 + 1e-8 * 1653 + 1e-10 * 51_878
    assert m.step_time(s) == pytest.approx(expected, rel=1e-12)
    vec = FittedLatency.feature_vector(s)
    assert m.step_time(s) == pytest.approx(sum(coefs.get(f, 0.0) * v for f, v in zip(FEATURES, vec)), rel=1e-12)


def test_fitted_floor() -> None:
    m = FittedLatency({"num_prefill_tokens": 1e-5})
    assert m.step_time(StepShape.decode_only(4, 100)) == MIN_STEP_TIME_S


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_fitted_round_trip(tmp_path, suffix: str) -> None:
    meta = {"device": "NVIDIA H200", "torch_version": "2.5.1", "git_commit": "abc1234",
            "created": "2025-01-31T12:00:00Z", "model_shape": "llama-3-8b",
            "fit": {"mape": 0.03, "n_samples": 100}}
    m = FittedLatency({"intercept": 0.003, "num_new_tokens": 2e-5, "context_tokens": 1e-9}, meta)
    path = tmp_path / f"fit{suffix}"
    m.to_file(path)
    back = FittedLatency.from_file(path)
    assert back.coefs == m.coefs and back.metadata == meta
    assert back.step_time(_shape()) == m.step_time(_shape())
    assert back.describe()["features"] == m.coefs and back.describe()["device"] == "NVIDIA H200"


def test_fitted_rejects_bad_files(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"kind": "fitted_linear", "features": {"intercept": 0.001, "num_tokens": 1e-5}}))
    with pytest.raises(ValueError, match=r"num_tokens.*") as err:
        FittedLatency.from_file(path)
    assert str(path) in str(err.value)
    path.write_text(json.dumps({"kind": "something_else", "features": {"intercept": 1}}))
    with pytest.raises(ValueError, match="kind"):
        FittedLatency.from_file(path)
    with pytest.raises(ValueError, match="num_seqs"):
        FittedLatency({"intercept": 0.001, "num_seqs": -1e-5})
    with pytest.raises(ValueError, match="zero"):
        FittedLatency({"intercept": 0.0})


def test_fixed_latency_unchanged() -> None:
    assert FixedLatency(0.01).step_time(_shape()) == 0.01
    with pytest.raises(ValueError):
        FixedLatency(0)


def test_step_shape_is_a_value() -> None:
    """StepShape compares, hashes, prints and pickles by its six fields, as the NamedTuple it
    replaced (``sim.core.executor``: a plain class, compiled natively with the step modules)."""
    import copy
    import pickle

    s = _shape()
    same = StepShape(*s.fields())
    assert s == same and hash(s) == hash(same) and s != StepShape(4, 3, 53, 50, 1600, 1)
    assert s != s.fields() and (s == s.fields()) is False  # not a tuple
    assert pickle.loads(pickle.dumps(s)) == s and copy.deepcopy(s) == s
    assert repr(s) == ("StepShape(num_seqs=4, num_decode_seqs=3, num_new_tokens=53, num_prefill_tokens=50, "
                       f"context_tokens={s.context_tokens}, attention_pairs={s.attention_pairs})")
    assert len({s, same}) == 1
