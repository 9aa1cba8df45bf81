"""The torch backend's pieces: batch layout, block-table mirror, attention paths and their
selection, the executor contract, the config/CLI wiring, and the prepared GPU script (CPU mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("torch_one_thread")  # the `model` fixture is in conftest.py

from gpu_backend.attention import ReferenceAttention, probe_attention, select_attention  # noqa: E402
from gpu_backend.executor.model import LlamaModel  # noqa: E402
from gpu_backend.layout.batch import SeqInput, build_batch  # noqa: E402
from gpu_backend.layout.kv_cache import BlockTables  # noqa: E402
from gpu_backend.layout.shapes import TINY, resolve_model_shape  # noqa: E402
from gpu_backend.validation import cases  # noqa: E402
from sim.core.request import GENERATED_TOKEN_BASE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]




# ----------------------------------------------------------------------------- batch layout


def test_build_batch_flattens_mixed_steps_and_maps_slots():
    big = GENERATED_TOKEN_BASE | (7 << 24) | 3
    seqs = [
        SeqInput("dec", np.array([big]), 20, [5, 9]),  # decode at position 20 -> block 9, offset 4
        SeqInput("chunk", np.arange(6), 14, [3, 7], sample=False),  # positions 14..19 straddle 2 blocks
    ]
    b = build_batch(seqs, block_size=16, vocab_size=4000, device="cpu")
    assert b.input_ids.tolist() == [big % 4000] + list(range(6))
    assert b.positions.tolist() == [20, 14, 15, 16, 17, 18, 19]
    assert b.slot_mapping.tolist() == [9 * 16 + 4, 3 * 16 + 14, 3 * 16 + 15, 7 * 16, 7 * 16 + 1, 7 * 16 + 2, 7 * 16 + 3]
    assert b.query_start_loc.tolist() == [0, 1, 7]
    assert b.seq_lens == [21, 20] and b.context_lens == [20, 14]
    assert b.block_table.tolist() == [[5, 9], [3, 7]]
    assert b.sample_rows.tolist() == [0] and b.sample_positions == [20]
    assert b.decode_seqs == [0] and b.prefill_seqs == [1]
    with pytest.raises(ValueError, match="only 1 blocks"):
        build_batch([SeqInput("x", np.arange(5), 14, [3])], block_size=16, vocab_size=10, device="cpu")


# ----------------------------------------------------------------------------- block-table mirror


def test_block_tables_follow_the_output_stream_and_catch_desync(model):
    h = cases.Harness(model, num_blocks=14, max_model_len=256)
    common = cases._toks(11, 32)
    a = h.request("a", np.concatenate([common, cases._toks(12, 30)]), 90)
    b = h.request("b", np.concatenate([common, cases._toks(13, 40)]), 60)
    seen = []
    orig = h.executor.block_tables.verify

    def spy(kvm):
        orig(kvm)
        seen.append({rid: list(t) for rid, t in h.executor.block_tables.tables.items()})

    h.executor.block_tables.verify = spy
    h.run({0: [a, b]})
    assert len(seen) == h.steps and h.preempted  # verified after every step, preemption included
    # a desynchronised mirror is caught
    tables = BlockTables()
    tables.tables["ghost"] = [1]
    with pytest.raises(AssertionError, match="ghost"):
        tables.verify(h.scheduler.kv_cache_manager)


def test_block_tables_reject_inconsistent_streams():
    from types import SimpleNamespace as NS

    req = NS(request_id="r")
    running = NS(request=req, admitted=False, num_computed_before=0, num_new_tokens=1, new_block_ids=[], hit_tokens=0)
    with pytest.raises(AssertionError, match="unknown to the runner"):
        BlockTables().apply(NS(finished_req_ids=set(), preempted=[], scheduled=[running]))
    admitted = NS(request=req, admitted=True, num_computed_before=16, num_new_tokens=4, new_block_ids=[2, 3],
                  hit_tokens=16, external_hit_tokens=0)
    t = BlockTables()
    t.apply(NS(finished_req_ids=set(), preempted=[], scheduled=[admitted]))
    assert t.tables == {"r": [2, 3]} and t.computed == {"r": 20}
    with pytest.raises(AssertionError, match="still holds"):
        t.apply(NS(finished_req_ids=set(), preempted=[], scheduled=[admitted]))
    t.apply(NS(finished_req_ids={"r"}, preempted=[], scheduled=[]))
    assert t.tables == {}


# ----------------------------------------------------------------------------- attention


def _naive(q, kc, vc, batch, scale):
    """float64 softmax attention, one query at a time, bottom-right causal by construction."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // kc.shape[2]
    bs = batch.block_size
    for i in range(batch.num_seqs):
        table = batch.block_tables[i]
        for j in range(batch.query_lens[i]):
            row = batch.query_start(i) + j
            pos = batch.context_lens[i] + j
            slots = [table[p // bs] * bs + p % bs for p in range(pos + 1)]
            k = kc.reshape(-1, *kc.shape[2:])[slots].double()
            v = vc.reshape(-1, *vc.shape[2:])[slots].double()
            for hq in range(q.shape[1]):
                s = (k[:, hq // group] @ q[row, hq].double()) * scale
                out[row, hq] = torch.softmax(s, 0) @ v[:, hq // group]
    return out


def test_reference_attention_equals_naive_and_top_left_does_not():
    g = torch.Generator().manual_seed(3)
    bs, hq, hkv, d = 8, 4, 2, 16
    shapes = [(0, 5), (13, 1), (8, 7), (3, 2)]
    perm = (torch.randperm(20, generator=g) + 1).tolist()
    seqs, used = [], 0
    for c, n in shapes:
        nb = -(-(c + n) // bs)
        seqs.append(SeqInput(f"s{len(seqs)}", np.zeros(n, dtype=np.int64), c, perm[used : used + nb]))
        used += nb
    batch = build_batch(seqs, block_size=bs, vocab_size=2, device="cpu")
    kc, vc = torch.randn(21, bs, hkv, d, generator=g), torch.randn(21, bs, hkv, d, generator=g)
    q = torch.randn(batch.num_tokens, hq, d, generator=g)
    ref = _naive(q, kc, vc, batch, d ** -0.5)
    got = ReferenceAttention()(q, kc, vc, batch, d ** -0.5)
    assert (got.double() - ref).abs().max() < 1e-5
    bad = ReferenceAttention("top_left")(q, kc, vc, batch, d ** -0.5)
    assert (bad.double() - ref).abs().max() > 1e-2


def test_select_attention_on_cpu():
    dims = dict(device="cpu", dtype=torch.float32, block_size=16, num_heads=4, num_kv_heads=2, head_dim=64)
    backend, report = select_attention("auto", **dims)
    assert report["name"] == "reference" and backend.name == "reference"
    with pytest.raises(RuntimeError, match="not usable"):
        select_attention("flash_gather", **dims)
    assert probe_attention(ReferenceAttention(), "all", **dims) < 1e-5


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("triton") is None,
    reason="triton is not installed: this CPU test of the kernel runs where it is (pip install triton; CUDA boxes "
           "have it), under TRITON_INTERPRET=1")
def test_triton_decode_kernel_under_the_interpreter():
    """Our Triton decode kernel in Triton's interpreter on CPU tensors against the reference
    attention: the probe batch (block boundaries, a shared block, garbage in unused slots) at two
    head layouts and split counts, and long context -- two sequences of >= 32k tokens (2,000+
    scattered 16-token blocks each), one ending mid-block."""
    code = (
        "import torch\n"
        "from gpu_backend.attention import ReferenceAttention, TritonDecodeAttention, probe_attention\n"
        "from gpu_backend.layout.batch import SeqInput, build_batch\n"
        "import numpy as np\n"
        "for bs, hq, hkv, d, splits in [(16, 4, 2, 64, None), (8, 12, 4, 80, 3), (16, 4, 2, 64, 1)]:\n"
        "    err = probe_attention(TritonDecodeAttention(num_splits=splits), 'decode', device='cpu',\n"
        "                          dtype=torch.float32, block_size=bs, num_heads=hq, num_kv_heads=hkv, head_dim=d)\n"
        "    assert err < 1e-4, (bs, hq, hkv, d, splits, err)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "lens = [32768, 33001]\n"
        "need = [-(-n // 16) for n in lens]\n"
        "perm = (torch.randperm(sum(need) + 7, generator=g) + 1).tolist()\n"
        "seqs = [SeqInput('a', np.zeros(1, dtype=np.int64), lens[0] - 1, perm[:need[0]]),\n"
        "        SeqInput('b', np.zeros(1, dtype=np.int64), lens[1] - 1, perm[need[0]:need[0] + need[1]])]\n"
        "batch = build_batch(seqs, block_size=16, vocab_size=2, device='cpu')\n"
        "shape = (sum(need) + 8, 16, 2, 64)\n"
        "kc, vc = torch.randn(shape, generator=g), torch.randn(shape, generator=g)\n"
        "q = torch.randn((2, 4, 64), generator=g)\n"
        "ref, got = torch.zeros_like(q), torch.zeros_like(q)\n"
        "ReferenceAttention().run(q, kc, vc, batch, 0.125, 'all', ref)\n"
        "TritonDecodeAttention(num_splits=4).run(q, kc, vc, batch, 0.125, 'all', got)\n"
        "err = (got - ref).abs().max().item()\n"
        "assert err < 1e-4, err\n"
        "bad = kc.clone(); bad[perm[need[0] + 1000]] += 1.0  # one block of b in the middle of its context\n"
        "got2 = torch.zeros_like(q)\n"
        "TritonDecodeAttention(num_splits=4).run(q, bad, vc, batch, 0.125, 'all', got2)\n"
        "assert (got2[0] - ref[0]).abs().max() < 1e-4 < (got2[1] - ref[1]).abs().max()\n"
        "print('long context max err', err)\n"
    )
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "long context max err" in p.stdout


# ----------------------------------------------------------------------------- executor contract


def test_executor_samples_the_planned_tokens_and_keeps_logits(model):
    h = cases.Harness(model)
    r = h.request("r", cases._toks(1, 20), 3)  # simulator-generated output ids (2**62 | uid << 24 | j)
    h.run({0: [r]})
    assert list(r.output_token_ids) == [r.planned_output_token(j) for j in range(3)]
    kept = h.executor.kept_logits["r"]
    assert [pos for pos, _ in kept] == [19, 20, 21]
    assert all(row.shape == (TINY.vocab_size,) for _, row in kept)
    assert [k for _, k, *_ in h.executor.step_log] == ["prefill", "decode", "decode"]
    assert all(t > 0 for *_, t in h.executor.step_log)


def test_model_shapes_resolve():
    assert resolve_model_shape("tiny") is TINY
    spec = resolve_model_shape("llama-3-8b")
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (32, 32, 8, 128)


# ----------------------------------------------------------------------------- config, CLI, replay


def test_backend_config_section():
    from sim.experiment.config import ConfigError, config_from_dict

    base = {"name": "x", "workload": {"kind": "synthetic_shared_prefix"}}
    cfg = config_from_dict(base)
    assert cfg.backend.model_shape == "tiny" and cfg.backend.device == "cpu" and cfg.backend.dtype == "float32"
    with pytest.raises(ConfigError, match="backend.dtyp: unknown key"):
        config_from_dict({**base, "backend": {"dtyp": "float32"}})
    with pytest.raises(ConfigError, match="backend.device"):
        config_from_dict({**base, "backend": {"device": "tpu"}})


def test_cli_torch_backend_replays_quickstart(tmp_path, capsys):
    from sim.cli.main import main

    assert main(["run", str(ROOT / "configs/quickstart_torch.yaml"), "--backend", "torch", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    assert "torch backend" in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert summary["num_requests"] == 30
    assert summary["num_preemptions"] >= 1 and summary["token_hit_rate"] > 0.2
    assert meta["executor"]["attention"] == "reference" and meta["executor"]["model_shape"] == "tiny"
    for f in ("requests.parquet", "steps.parquet", "config.resolved.yaml"):
        assert (tmp_path / f).exists()
    assert main(["run", str(ROOT / "configs/quickstart_torch.yaml"), "--device", "cpu", "--out", str(tmp_path)]) == 2


def test_sim_path_never_imports_torch(tmp_path):
    code = (
        "import sys\n"
        "from sim.cli.main import main\n"
        f"rc = main(['run', {str(ROOT / 'configs/quickstart_torch.yaml')!r}, '--out', {str(tmp_path)!r}, "
        "'--no-progress'])\n"
        "assert rc == 0, rc\n"
        "assert 'torch' not in sys.modules and 'gpu_backend' not in sys.modules\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def _emulated_varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                          enable_gqa=False, seqused_k=None, block_table=None, **_):
    """CPU stand-in with flash attention's documented varlen semantics (bottom-right causal for
    ``window_size=(-1, 0)``, GQA, paged K/V through ``block_table`` + ``seqused_k``)."""
    assert window_size == (-1, 0) and enable_gqa
    assert cu_seq_q.dtype == torch.int32 and (block_table is None or block_table.dtype == torch.int32)
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[-2]
    for i in range(len(cu_seq_q) - 1):
        q0, q1 = int(cu_seq_q[i]), int(cu_seq_q[i + 1])
        if block_table is None:
            ki, vi = k[int(cu_seq_k[i]) : int(cu_seq_k[i + 1])], v[int(cu_seq_k[i]) : int(cu_seq_k[i + 1])]
        else:
            n = int(seqused_k[i])
            page = k.shape[1]
            pages = block_table[i, : -(-n // page)].long()
            ki = k[pages].reshape(-1, *k.shape[2:])[:n]
            vi = v[pages].reshape(-1, *v.shape[2:])[:n]
        lq, lk = q1 - q0, ki.shape[0]
        allowed = torch.arange(lk)[None, :] <= (torch.arange(lq) + lk - lq)[:, None]
        qi = q[q0:q1].transpose(0, 1)
        kk = ki.transpose(0, 1).repeat_interleave(group, 0)
        vv = vi.transpose(0, 1).repeat_interleave(group, 0)
        out[q0:q1] = torch.nn.functional.scaled_dot_product_attention(qi, kk, vv, attn_mask=allowed,
                                                                      scale=scale).transpose(0, 1)
    return out


def test_flash_paths_plumbing_with_an_emulated_varlen_attn(monkeypatch):
    """The CUDA-only flash paths' batching (subsets, cu_seqlens, gathered slots, block tables) checked
    on CPU against the reference, with varlen_attn replaced by an emulation of its semantics."""
    import gpu_backend.attention as att
    import gpu_backend.attention.flash as flash

    monkeypatch.setattr(flash, "find_varlen_attn", lambda: _emulated_varlen_attn)
    dims = dict(device="cpu", dtype=torch.float32, block_size=16, num_heads=8, num_kv_heads=2, head_dim=32)
    paged = dict(dims, block_size=256)  # FlashAttention-2's paged mode: pages of a multiple of 256 tokens
    for impl, which, d in [(att.FlashPagedAttention(), "all", paged), (att.FlashPagedAttention(), "decode", paged),
                           (att.FlashPagedAttention(), "prefill", paged), (att.FlashGatherAttention(), "prefill", dims),
                           (att.FlashGatherAttention(), "all", dims)]:
        assert probe_attention(impl, which, **d) < 1e-5, (impl.name, which)
    # and a split backend (emulated flash prefill + reference decode) inside a full scheduler case
    model = LlamaModel(TINY, dtype=torch.float32, device="cpu", seed=0)
    split = att.SplitAttention(att.ReferenceAttention(), att.FlashGatherAttention())
    r = cases.case_chunked_prefill_decode(model, split)
    assert r.facts["ok_scenario"] and r.max_abs_diff <= cases.FP32_TOL, r.summary()
    fp = att.FlashPagedAttention()
    r = cases.case_random_mix(model, att.SplitAttention(fp, fp), block_size=256)
    assert r.max_abs_diff <= cases.FP32_TOL, r.summary()


def test_flash_paged_refuses_block_sizes_flash_attention_2_cannot_page():
    """FA2's paged KV cache takes pages of a multiple of 256 tokens: any other block size is refused
    up front, by name of the constraint, not by a kernel error on the device."""
    import gpu_backend.attention.flash as flash

    msg = "multiple of 256"
    assert flash.paged_block_size_refusal(256) is None and flash.paged_block_size_refusal(512) is None
    for bs in (16, 64, 128, 300):
        assert msg in flash.paged_block_size_refusal(bs) and f"got {bs}" in flash.paged_block_size_refusal(bs)
    dims = dict(device="cpu", dtype=torch.float32, num_heads=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(RuntimeError, match=msg):
        select_attention("flash_paged", block_size=16, **dims)
    with pytest.raises(RuntimeError, match="not usable"):  # at 256 it is the device that is missing
        select_attention("flash_paged", block_size=256, **dims)
    with pytest.raises(ValueError, match=msg):
        probe_attention(flash.FlashPagedAttention(), "all", block_size=16, **dims)
    from sim.experiment.config import ConfigError, load_config

    cfg = load_config(ROOT / "configs/quickstart_torch.yaml", ["backend.attention=flash_paged"])
    from gpu_backend.executor.factory import make_torch_executor
    from sim.experiment.engine_description import resolve
    from sim.experiment.run import build_scheduler

    with pytest.raises(ConfigError, match="backend.attention: flash_paged needs engine.block_size"):
        make_torch_executor(cfg, build_scheduler(resolve(cfg)))
