"""A step-latency model calibrated on a real backend: linear in features of :class:`StepShape`.

File format (JSON, or YAML when the name ends in .yaml/.yml), written by the calibration tool::

    {
      "kind": "fitted_linear",                      # required, exactly this
      "features": {                                 # required: feature -> seconds per unit, >= 0
        "intercept": 0.0042,                        #   seconds per step
        "num_new_tokens": 2.1e-5,
        "attention_pairs": 3.0e-11,
        "kv_read_tokens": 4.0e-9
      },
      "device": "NVIDIA H200",                      # everything else is free-form metadata,
      "torch_version": "2.5.1",                     # kept and written back unchanged;
      "git_commit": "abc1234",                      # these keys are the ones the calibration
      "created": "2025-01-31T12:00:00Z",            # tool writes
      "model_shape": "llama-3-8b",
      "fit": {"mape": 0.031, "n_samples": 4000}
    }

``features`` is any non-empty subset of :data:`FEATURES`: ``intercept`` (the constant 1) and the
fields and properties of :class:`StepShape` -- plus, optionally, *knee* features
``num_new_tokens_over_<K>`` = ``max(0, num_new_tokens - K)`` (an integer ``K >= 1``). A knee lets
the model bend like a roofline: a step's GEMMs cost about the same (weights streamed from memory)
until the batch holds ``K`` tokens and grow with the token count after that, which a single linear
term cannot follow (``a + b * max(0, n - a / b)`` *is* ``max(a, b * n)``). Files without knees read
exactly as before. ``mixed_step`` is 1 for a step that holds both decodes and prefill tokens (a
prefill chunk piggy-backing on decodes) and 0 otherwise: an extra cost per mixed step, for when
the data shows one (two attention paths, two metadata builds). ``multi_token_step`` is 1 for a
step that computes more than one token and 0 for a step of one token (a single decode): a matrix
product over one row runs as a matrix-vector product that streams each weight once, over two or
more rows as a blocked GEMM that first packs the weights (one more pass over them), so the second
token of a step costs more than each further one -- a concave step a linear term cannot follow
(measured on the CPU reference: ``results/reference/cpu_tiny/README.md``). Coefficients must be finite and
>= 0 and at least one must be > 0. The predicted step time is ``sum(coef * feature)``, floored
at :data:`MIN_STEP_TIME_S` (1 µs) so it is always > 0.

The hot path never touches a dict: the properties are linear in the six stored fields
(``num_prefill_seqs = num_seqs - num_decode_seqs``, ``num_decode_tokens = num_new_tokens -
num_prefill_tokens``, ``kv_read_tokens = context_tokens + num_new_tokens``), so the coefficients are
folded once into seven floats and :meth:`FittedLatency.step_time` is six multiply-adds (plus one
per knee feature and one test each for ``mixed_step`` and ``multi_token_step``, if any).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sim.core.executor import StepShape
from sim.timing.latency import LatencyModel

KIND = "fitted_linear"

#: Allowed features, in the order of :meth:`FittedLatency.feature_vector`.
FEATURES: tuple[str, ...] = (
    "intercept",
    "num_seqs",
    "num_decode_seqs",
    "num_prefill_seqs",
    "num_new_tokens",
    "num_prefill_tokens",
    "num_decode_tokens",
    "context_tokens",
    "attention_pairs",
    "kv_read_tokens",
    "mixed_step",
    "multi_token_step",
)

#: Indicator features: not linear in the stored fields, each one test in :meth:`FittedLatency.step_time`.
INDICATORS = ("mixed_step", "multi_token_step")

#: Knee features: ``num_new_tokens_over_<K>`` = ``max(0, num_new_tokens - K)``.
KNEE_RE = re.compile(r"^num_new_tokens_over_([1-9][0-9]*)$")


def knee_feature(k: int) -> str:
    """The name of the knee feature at ``k`` tokens."""
    return f"num_new_tokens_over_{int(k)}"


#: Floor on a predicted step time (seconds); a fit with a zero intercept could otherwise predict 0.
MIN_STEP_TIME_S = 1e-6

# feature -> {stored field (or "intercept"): multiplier}
_FOLD: dict[str, dict[str, int]] = {
    "intercept": {"intercept": 1},
    "num_seqs": {"num_seqs": 1},
    "num_decode_seqs": {"num_decode_seqs": 1},
    "num_prefill_seqs": {"num_seqs": 1, "num_decode_seqs": -1},
    "num_new_tokens": {"num_new_tokens": 1},
    "num_prefill_tokens": {"num_prefill_tokens": 1},
    "num_decode_tokens": {"num_new_tokens": 1, "num_prefill_tokens": -1},
    "context_tokens": {"context_tokens": 1},
    "attention_pairs": {"attention_pairs": 1},
    "kv_read_tokens": {"context_tokens": 1, "num_new_tokens": 1},
}


def _read(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        return yaml.safe_load(text)
    return json.loads(text)


class FittedLatency(LatencyModel):
    """``step_time = max(MIN_STEP_TIME_S, sum(coefs[f] * feature_f(shape)))``; see the module doc."""

    name = "fitted"
    FEATURES = FEATURES

    def __init__(self, coefs: Mapping[str, float], metadata: Mapping[str, Any] | None = None,
                 *, source: str | None = None) -> None:
        where = f" in {source}" if source else ""
        if not isinstance(coefs, Mapping) or not coefs:
            raise ValueError(f"fitted latency{where}: 'features' must be a non-empty mapping")
        clean: dict[str, float] = {}
        for feat, value in coefs.items():
            if feat not in _FOLD and feat not in INDICATORS and not (isinstance(feat, str) and KNEE_RE.match(feat)):
                raise ValueError(
                    f"fitted latency{where}: unknown feature {feat!r}; allowed: {', '.join(FEATURES)} "
                    f"and num_new_tokens_over_<K>"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"fitted latency{where}: coefficient of {feat!r} must be a finite number >= 0, got {value!r}"
                )
            clean[feat] = float(value)
        if not any(v > 0 for v in clean.values()):
            raise ValueError(f"fitted latency{where}: all coefficients are zero")
        meta = dict(metadata or {})
        for reserved in ("kind", "features"):
            meta.pop(reserved, None)
        knees = sorted((f for f in clean if f not in _FOLD and f not in INDICATORS),
                       key=lambda f: int(KNEE_RE.match(f).group(1)))  # type: ignore[union-attr]
        self.coefs = {f: clean[f] for f in (*FEATURES, *knees) if f in clean}  # canonical order
        self._knees = tuple((int(KNEE_RE.match(f).group(1)), clean[f]) for f in knees if clean[f] > 0)  # type: ignore[union-attr]
        self.metadata = meta
        self.source = source

        base = dict.fromkeys(("intercept", "num_seqs", "num_decode_seqs", "num_new_tokens",
                              "num_prefill_tokens", "context_tokens", "attention_pairs"), 0.0)
        for feat, value in self.coefs.items():
            for field_, mult in _FOLD.get(feat, {}).items():
                base[field_] += mult * value
        self._c0 = base["intercept"]
        self._c_seqs = base["num_seqs"]
        self._c_dec = base["num_decode_seqs"]
        self._c_new = base["num_new_tokens"]
        self._c_pre = base["num_prefill_tokens"]
        self._c_ctx = base["context_tokens"]
        self._c_pairs = base["attention_pairs"]
        self._c_mixed = self.coefs.get("mixed_step", 0.0)
        self._c_multi = self.coefs.get("multi_token_step", 0.0)

    # ------------------------------------------------------------------ files

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> FittedLatency:
        where = f" in {source}" if source else ""
        if not isinstance(data, Mapping):
            raise ValueError(f"fitted latency{where}: expected a mapping at top level")
        if data.get("kind") != KIND:
            raise ValueError(f"fitted latency{where}: 'kind' must be {KIND!r}, got {data.get('kind')!r}")
        if "features" not in data:
            raise ValueError(f"fitted latency{where}: missing 'features'")
        return cls(data["features"], {k: v for k, v in data.items() if k not in ("kind", "features")},
                   source=source)

    @classmethod
    def from_file(cls, path: str | Path) -> FittedLatency:
        path = Path(path)
        try:
            data = _read(path)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ValueError(f"fitted latency: cannot parse {path}: {exc}") from exc
        return cls.from_dict(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "features": dict(self.coefs), **self.metadata}

    def to_file(self, path: str | Path) -> None:
        """Write JSON, or YAML when the suffix is .yaml/.yml."""
        path = Path(path)
        if path.suffix.lower() in (".yaml", ".yml"):
            text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        else:
            text = json.dumps(self.to_dict(), indent=2) + "\n"
        path.write_text(text, encoding="utf-8")

    # ------------------------------------------------------------------ model

    @staticmethod
    def feature_vector(shape: StepShape) -> list[float]:
        """Values of all :data:`FEATURES` for ``shape``, in that order (a design-matrix row)."""
        s = shape
        return [
            1.0,
            float(s.num_seqs),
            float(s.num_decode_seqs),
            float(s.num_seqs - s.num_decode_seqs),
            float(s.num_new_tokens),
            float(s.num_prefill_tokens),
            float(s.num_new_tokens - s.num_prefill_tokens),
            float(s.context_tokens),
            float(s.attention_pairs),
            float(s.context_tokens + s.num_new_tokens),
            1.0 if 0 < s.num_decode_seqs < s.num_seqs else 0.0,
            1.0 if s.num_new_tokens > 1 else 0.0,
        ]

    @staticmethod
    def feature_value(name: str, shape: StepShape) -> float:
        """The value of one feature (a :data:`FEATURES` name or a knee feature) for ``shape``."""
        if name in FEATURES:
            return FittedLatency.feature_vector(shape)[FEATURES.index(name)]
        m = KNEE_RE.match(name)
        if m is None:
            raise ValueError(f"unknown feature {name!r}")
        return float(max(0, shape.num_new_tokens - int(m.group(1))))

    def step_time(self, shape: StepShape) -> float:
        s = shape
        t = (self._c0 + self._c_seqs * s.num_seqs + self._c_dec * s.num_decode_seqs
             + self._c_new * s.num_new_tokens + self._c_pre * s.num_prefill_tokens
             + self._c_ctx * s.context_tokens + self._c_pairs * s.attention_pairs)
        for k, c in self._knees:
            if s.num_new_tokens > k:
                t += c * (s.num_new_tokens - k)
        if self._c_mixed and 0 < s.num_decode_seqs < s.num_seqs:
            t += self._c_mixed
        if self._c_multi and s.num_new_tokens > 1:
            t += self._c_multi
        return t if t > MIN_STEP_TIME_S else MIN_STEP_TIME_S

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "features": dict(self.coefs), **self.metadata}
