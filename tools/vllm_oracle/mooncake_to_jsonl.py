#!/usr/bin/env python3
"""Convert a slice of the Mooncake conversation trace to the canonical JSONL
trace format consumed by oracle.py.

Mooncake rows: {"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [h0, h1, ...]}, one hash id per 512-token block (last block
partial). Each hash id h is expanded into `--tokens-per-id` (T, default 512)
distinct token ids h*T + k (k = 0..T-1); the prompt is the concatenation,
truncated to the (scaled) input length ceil(input_length * T / 512) and then
optionally to --max-input. Identical hash-id prefixes therefore give
identical token prefixes, and different hash ids never share a token.

Output (one JSON object per line, in trace order):
  {"id", "arrival" = timestamp/1000*time_scale, "tokens", "output_tokens",
   "salt", "lora", "priority", "prompt_logprobs"}

Optional decorations for mixed-feature traces (all deterministic via --seed):
  --salts a,b,,c     cache_salt drawn uniformly from the list for a
                     --salt-frac fraction of requests ("" = empty salt)
  --prompt-logprobs-frac F   fraction of requests with prompt_logprobs
  --priorities 0,1,2 priority drawn uniformly from the list
  --loras A,B --lora-frac F  LoRA name for a fraction of requests

Row selection: rows --start.. in file order, --count of them. With
--conversations K only rows of the first K distinct "conversations" (keyed
by hash_ids[1], i.e. the first block after the shared system-prompt block;
single-block rows key on hash_ids[0]) met from --start are kept, so that
multi-turn follow-ups (median reuse distance ~1100 rows in this trace) land
in the same slice. Combine with a small --time-scale.
"""
import argparse
import json
import os
import random
import sys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "workloads",
        "data", "mooncake_conversation_sample.jsonl"),
        help="Mooncake conversation trace (default: the sample bundled with "
        "apcsim)")
    p.add_argument("--out", required=True)
    p.add_argument("--start", type=int, default=0, help="first row (0-based)")
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="arrival = timestamp/1000 * time_scale")
    p.add_argument("--tokens-per-id", type=int, default=512,
                   help="tokens each 512-token hash id expands to")
    p.add_argument("--max-input", type=int, default=0,
                   help="truncate prompts to this many tokens (0 = no cap)")
    p.add_argument("--max-output", type=int, default=0,
                   help="cap output_tokens (0 = no cap)")
    p.add_argument("--conversations", type=int, default=0,
                   help="keep only rows of the first K conversations (0=all)")
    p.add_argument("--id-prefix", default="m")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--salts", default=None)
    p.add_argument("--salt-frac", type=float, default=0.0)
    p.add_argument("--prompt-logprobs-frac", type=float, default=0.0)
    p.add_argument("--priorities", default=None)
    p.add_argument("--loras", default=None)
    p.add_argument("--lora-frac", type=float, default=0.0)
    a = p.parse_args(argv)

    T = a.tokens_per_id
    assert 1 <= T <= 512
    rng = random.Random(a.seed)
    salts = a.salts.split(",") if a.salts is not None else None
    prios = [int(x) for x in a.priorities.split(",")] if a.priorities else None
    loras = a.loras.split(",") if a.loras else None

    conv_keys: set = set()
    n_written = n_tok = 0
    with open(a.input) as fin, open(a.out, "w") as fout:
        for row_idx, line in enumerate(fin):
            if row_idx < a.start:
                continue
            if n_written >= a.count:
                break
            row = json.loads(line)
            if a.conversations:
                h = row["hash_ids"]
                key = h[1] if len(h) > 1 else ("single", h[0])
                if key not in conv_keys:
                    if len(conv_keys) >= a.conversations:
                        continue
                    conv_keys.add(key)
            n_in = -(-row["input_length"] * T // 512)  # ceil
            if a.max_input:
                n_in = min(n_in, a.max_input)
            toks = []
            for h in row["hash_ids"]:
                if len(toks) >= n_in:
                    break
                toks.extend(range(h * T, h * T + T))
            toks = toks[:n_in]
            assert len(toks) == n_in, (row_idx, len(toks), n_in)
            n_out = row["output_length"]
            if a.max_output:
                n_out = min(n_out, a.max_output)
            n_out = max(n_out, 1)
            # draw the decorations in a fixed order so they are reproducible
            salt = None
            if salts is not None and rng.random() < a.salt_frac:
                salt = rng.choice(salts)
            plp = rng.random() < a.prompt_logprobs_frac
            prio = rng.choice(prios) if prios else 0
            lora = None
            if loras and rng.random() < a.lora_frac:
                lora = rng.choice(loras)
            rec = {
                "id": f"{a.id_prefix}{row_idx}",
                "arrival": round(row["timestamp"] / 1000.0 * a.time_scale, 6),
                "tokens": toks,
                "output_tokens": n_out,
                "salt": salt,
                "lora": lora,
                "priority": prio,
                "prompt_logprobs": plp,
            }
            fout.write(json.dumps(rec, separators=(",", ":")) + "\n")
            n_written += 1
            n_tok += n_in
    print(f"wrote {n_written} requests, {n_tok} prompt tokens -> {a.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
