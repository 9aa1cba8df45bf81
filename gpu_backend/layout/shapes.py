"""Model shapes for the torch backend (no torch import here).

``tiny`` is the CI model (4 layers, hidden 256, 4 query / 2 KV heads of 64, SwiGLU 688, vocab
4000, meant for fp32 on a CPU); any other name or YAML path resolves through
:func:`sim.timing.roofline.load_model_spec` (``llama-3-8b``, ``llama-3.2-1b``, ... or a user file with the
same fields), so the real backend and the roofline model share one source of shapes.

The tiny vocabulary is deliberately not a power of two: ``token_id % vocab_size`` then keeps the
simulator's generated ids (``2**62 | uid << 24 | j``) distinct across requests.
"""

from __future__ import annotations

from pathlib import Path

from sim.timing.roofline import ModelSpec, load_model_spec

TINY = ModelSpec(
    name="tiny",
    num_layers=4,
    hidden_size=256,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=688,
    vocab_size=4000,
    max_model_len=8192,
    dtype_bytes=4,
)

ROPE_THETA = 500_000.0  # Llama-3's base; Llama-3.1's long-context frequency scaling is not applied
RMS_EPS = 1e-5

BUILTIN_SHAPES = {"tiny": TINY}


def resolve_model_shape(name: str, base_dir: str | Path | None = None) -> ModelSpec:
    """``tiny``, a model known to ``sim.timing.roofline`` (``llama-3-8b`` ...), or a YAML spec path
    (relative paths resolve against ``base_dir``, the config file's folder)."""
    if name.lower() in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[name.lower()]
    if name.endswith((".yaml", ".yml")) or "#" in name:
        path, sep, pick = name.partition("#")
        p = Path(path).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = Path(base_dir) / p
        return load_model_spec(str(p) + (sep + pick if sep else ""))
    return load_model_spec(name)
