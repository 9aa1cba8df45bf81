"""The experiment config as a JSON Schema and as the docs' config reference, both generated from the
pydantic models of ``sim.experiment.config`` (as vLLM generates its engine-argument docs from
``EngineArgs``' dataclass fields), so neither can drift from what ``load_config`` accepts.

``config_json_schema()`` is ``ExperimentConfig``'s JSON Schema (draft 2020-12), without the two
internal fields (``base_dir``, ``source``), each key annotated with its unit (``x-unit``) and the
vLLM flag it mirrors (``x-vllm-flag``); editors with a YAML language server complete and check a
config against it. ``render_reference()`` turns that schema into ``docs/config_reference.md``: one
table per model (key, type, default, unit, vLLM flag), models reached through a reference linked
to their own table. Units come from the key's name (``*_s`` seconds, ``*_gib`` GiB, ...) or from
``_UNITS``; vLLM flags from ``_VLLM_FLAGS`` (vLLM 0.33.0's ``vllm/engine/arg_utils.py`` and the
offloading connector's extra-config keys).
Invariants: pure functions of the models; the output is deterministic (keys in model order).
Imports neither simpy nor torch.
"""

from __future__ import annotations

import json
from typing import Any

from sim.experiment.config import ExperimentConfig

_INTERNAL = ("base_dir", "source")

_VLLM_FLAGS: dict[tuple[str, str], str] = {
    ("ExperimentConfig", "model"): "--model",
    ("EngineConfig", "block_size"): "--block-size",
    ("EngineConfig", "num_gpu_blocks"): "--num-gpu-blocks-override",
    ("EngineConfig", "kv_cache_gib"): "--kv-cache-memory-bytes (in GiB here)",
    ("EngineConfig", "kv_cache_fraction"): "--num-gpu-blocks-override (that share of the profiled pool)",
    ("EngineConfig", "gpu_memory_utilization"): "--gpu-memory-utilization",
    ("EngineConfig", "max_num_batched_tokens"): "--max-num-batched-tokens",
    ("EngineConfig", "max_num_seqs"): "--max-num-seqs",
    ("EngineConfig", "max_model_len"): "--max-model-len",
    ("EngineConfig", "enable_chunked_prefill"): "--enable-chunked-prefill",
    ("EngineConfig", "long_prefill_token_threshold"): "--long-prefill-token-threshold",
    ("EngineConfig", "policy"): "--scheduling-policy",
    ("EngineConfig", "watermark"): "--watermark",
    ("EngineConfig", "scheduler_reserve_full_isl"): "--scheduler-reserve-full-isl",
    ("EngineConfig", "enable_prefix_caching"): "--enable-prefix-caching",
    ("EngineConfig", "hash_algo"): "--prefix-caching-hash-algo",
    ("EngineConfig", "hash_seed"): "PYTHONHASHSEED (environment)",
    ("EngineConfig", "use_eagle"): "--speculative-config '{\"method\": \"eagle\", ...}'",
    ("EngineConfig", "async_scheduling"): "--async-scheduling",
    ("EngineConfig", "hash_block_size"): "--prefix-match-unit (0.33.0)",
    ("EngineConfig", "prefix_match_unit"): "--prefix-match-unit",
    ("EngineConfig", "max_num_active_seqs"): "--max-num-active-seqs",
    ("EngineConfig", "prefill_schedule_interval"): "--prefill-schedule-interval",
    ("EngineConfig", "kv_offloading_size"): "--kv-offloading-size",
    ("EngineConfig", "kv_offloading_policy"): "--kv-transfer-config extra: eviction_policy",
    ("EngineConfig", "kv_offloading_block_size"): "--kv-transfer-config extra: block_size",
    ("EngineConfig", "offload_prompt_only"): "--kv-transfer-config extra: offload_prompt_only",
    ("EngineConfig", "store_threshold"): "--kv-transfer-config extra: store_threshold",
    ("EngineConfig", "self_describing_kv_events"): "--kv-transfer-config extra: self_describing_kv_events",
}

_UNITS: dict[str, str] = {
    "block_size": "tokens", "hash_block_size": "tokens", "prefix_match_unit": "tokens",
    "kv_offloading_block_size": "tokens", "max_model_len": "tokens", "max_num_batched_tokens": "tokens",
    "long_prefill_token_threshold": "tokens", "num_gpu_blocks": "blocks", "num_cpu_blocks": "chunks",
    "kv_offloading_size": "GiB", "gpu_memory_utilization": "fraction", "kv_cache_fraction": "share of the pool",
    "watermark": "fraction of blocks",
    "rate": "requests/s", "think_time": "s", "step_gap": "s", "window_s": "s", "sliding_window": "tokens",
    "time_scale": "x", "rate_scale": "x", "tokens_per_id": "tokens", "prime_fraction": "fraction of the pool",
    "shared_prompt_fraction": "fraction", "subagent_probability": "probability", "confidence": "probability",
    "down_at": "s (simulated)", "up_at": "s (simulated)", "lru_capacity": "blocks",
}


_UNSET_MEANS: dict[str, str] = {
    "num_gpu_blocks": "unset: vLLM's profiled pool for the model and GPU",
    "max_model_len": "unset: the model's own",
    "kv_cache_gib": "unset: vLLM's profiled pool",
}


def _unit(field: str) -> str:
    if field in _UNITS:
        return _UNITS[field]
    for suffix, unit in (("_gb_s", "GB/s"), ("_gib", "GiB"), ("_s", "s"), ("_tokens", "tokens"),
                         ("_fraction", "fraction")):
        if field.endswith(suffix):
            return unit
    return ""


def _annotate(schema: dict[str, Any]) -> None:
    """Add ``x-unit`` / ``x-vllm-flag`` (and a description naming them) to each property, in place."""
    for name, model in schema.get("$defs", {}).items():
        for field, prop in model.get("properties", {}).items():
            unit, flag = _unit(field), _VLLM_FLAGS.get((name, field), "")
            if unit:
                prop["x-unit"] = unit
            if flag:
                prop["x-vllm-flag"] = flag
            notes = [f"unit: {unit}" if unit else "", f"vLLM: {flag}" if flag else ""]
            if any(notes):
                prop.setdefault("description", "; ".join(n for n in notes if n))


def _shorthand(node: Any) -> Any:
    """The forms the models' before-validators also accept: a number for a distribution
    (``workloads.schema.DistField``: fixed), a router's name for the router mapping (``router:
    sglang``, ``compare: [round_robin]``) and ``on``/``off`` booleans for ``replay.attribution``."""
    if isinstance(node, list):
        return [_shorthand(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _shorthand(v) for k, v in node.items()}
    if node.get("$ref", "").endswith("/DistSpec"):
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return {"anyOf": [{"$ref": node["$ref"]}, {"type": "number"}], **extra}
    if node.get("discriminator", {}).get("propertyName") == "kind" and "Router" in str(node.get("oneOf")):
        names = sorted(node["discriminator"]["mapping"])
        extra = {k: v for k, v in node.items() if k not in ("oneOf", "discriminator")}
        return {"anyOf": [{k: node[k] for k in ("oneOf", "discriminator")}, {"enum": names}], **extra}
    return node


def config_json_schema() -> dict[str, Any]:
    """``ExperimentConfig``'s JSON Schema for editors, annotated with units and vLLM flags."""
    schema = _shorthand(ExperimentConfig.model_json_schema(mode="validation"))
    attribution = schema["$defs"]["ReplayConfig"]["properties"]["attribution"]
    schema["$defs"]["ReplayConfig"]["properties"]["attribution"] = {
        "anyOf": [{k: v for k, v in attribution.items() if k != "default"}, {"type": "boolean"}],
        "default": attribution["default"]}
    for key in _INTERNAL:
        schema["properties"].pop(key, None)
    root = {k: v for k, v in schema.items() if k != "$defs"}
    defs = {"ExperimentConfig": root, **schema.get("$defs", {})}
    _annotate({"$defs": defs})
    out: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    out.update(root)
    out["title"] = "apcsim experiment config"
    out["$defs"] = schema.get("$defs", {})
    return out


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _link(name: str) -> str:
    return f"[{name}](#{name.lower()})"


def _bounds(prop: dict[str, Any]) -> str:
    parts = []
    for key, op in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<=")):
        if key in prop:
            parts.append(f"{op} {prop[key]}")
    if "minLength" in prop:
        parts.append(f"length >= {prop['minLength']}")
    return (" " + ", ".join(parts)) if parts else ""


def _type(prop: dict[str, Any]) -> str:
    """A property's type in words, models linked to their tables."""
    if "$ref" in prop:
        return _link(_ref_name(prop["$ref"]))
    if "oneOf" in prop and "discriminator" in prop:
        key = prop["discriminator"]["propertyName"]
        return f"by `{key}`: " + ", ".join(_link(_ref_name(v["$ref"])) for v in prop["oneOf"])
    if "anyOf" in prop:
        alts = [a for a in prop["anyOf"] if a.get("type") != "null"]
        text = " or ".join(_type(a) for a in alts)
        return text + (" or unset" if len(alts) < len(prop["anyOf"]) else "")
    if "const" in prop:
        return f"`{prop['const']}`"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items") or (prop.get("prefixItems") or [{}])[0]
        return f"list of {_type(items)}"
    names = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "object": "mapping"}
    return names.get(str(kind), str(kind)) + _bounds(prop)


def _default(field: str, prop: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in prop:
        return ""
    value = prop["default"]
    if value is None:
        return _UNSET_MEANS.get(field, "unset")
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if v is not None}
        if len(value) > 4:
            return "its table's defaults"
    text = json.dumps(value) if not isinstance(value, str) else value
    return f"`{text}`".replace("|", "\\|")


def _models_in_order(schema: dict[str, Any]) -> list[str]:
    """Model names in the order a reader meets them, from the top level down."""
    order = ["ExperimentConfig"]
    defs = schema["$defs"]

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [_ref_name(node["$ref"])] if "$ref" in node else []
            return found + [r for key, v in node.items() if key != "discriminator" for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    i = 0
    while i < len(order):
        model = schema if order[i] == "ExperimentConfig" else defs[order[i]]
        for name in refs(model.get("properties", {})):
            if name not in order:
                order.append(name)
        i += 1
    return order


def render_reference(schema: dict[str, Any] | None = None) -> str:
    """``docs/config_reference.md``: every model's keys with type, default, unit and vLLM flag."""
    schema = schema or config_json_schema()
    lines = [
        "# Config reference",
        "",
        "<!-- Generated by `apcsim config reference` from the pydantic models"
        " (sim/experiment/config_schema.py); do not edit by hand. -->",
        "",
        "Every key an experiment YAML file takes, generated from the pydantic models that validate it:"
        " its type, default, unit and the vLLM flag it mirrors. How to write, check and override a"
        " config is in [Configs](configs.md); `apcsim config show CONFIG` prints one config fully"
        " resolved, with where each value came from.",
        "",
    ]
    for name in _models_in_order(schema):
        model = schema if name == "ExperimentConfig" else schema["$defs"][name]
        title = "ExperimentConfig (the top level)" if name == "ExperimentConfig" else name
        lines += [f"## {name}" if name != "ExperimentConfig" else "## ExperimentConfig", ""]
        doc = " ".join(str(model.get("description", "")).split())
        if doc and name != "ExperimentConfig":
            lines += [doc.replace("``", "`"), ""]
        elif name == "ExperimentConfig":
            lines += [f"{title}: one experiment.", ""]
        lines += ["| key | type | default | unit | vLLM flag |", "|---|---|---|---|---|"]
        required = set(model.get("required", ()))
        for field, prop in model.get("properties", {}).items():
            flag = prop.get("x-vllm-flag", "")
            lines.append(f"| `{field}` | {_type(prop)} | {_default(field, prop, field in required)} | "
                         f"{prop.get('x-unit', '')} | {f'`{flag}`' if flag else ''} |")
        lines.append("")
    return "\n".join(lines)
