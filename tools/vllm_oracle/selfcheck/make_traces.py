#!/usr/bin/env python3
"""Writes the hand-made self-check traces and their expected hit tokens.

Each case: <name>.jsonl (canonical trace) + an entry in expected.json:
  {name: {"args": [extra oracle args], "hits": {id: hit_tokens}}}
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
cases = {}


def P(n, base=1000):
    return list(range(base, base + n))


def case(name, reqs, hits, args=()):
    with open(os.path.join(HERE, name + ".jsonl"), "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    cases[name] = {"args": list(args), "hits": hits}


# 1. same prompt twice, 2nd arrives long after the 1st finished (bs=16)
for n, exp in ((15, 0), (16, 0), (32, 16), (33, 32)):
    case(f"repeat_{n}",
         [dict(id="a", arrival=0.0, tokens=P(n), output_tokens=5),
          dict(id="b", arrival=10.0, tokens=P(n), output_tokens=5)],
         {"a": 0, "b": exp})

# 2. cache_salt isolation: None / "x" / "x" / "y" / ""  ("" == no salt)
salts = [None, "x", "x", "y", ""]
case("salts",
     [dict(id=f"s{i}", arrival=10.0 * i, tokens=P(64), output_tokens=3,
           salt=s) for i, s in enumerate(salts)],
     {"s0": 0, "s1": 0, "s2": 48, "s3": 0, "s4": 48})

# 3. two identical 64-token prompts arriving together (same step)
case("concurrent_64",
     [dict(id="a", arrival=0.0, tokens=P(64), output_tokens=5),
      dict(id="b", arrival=0.0, tokens=P(64), output_tokens=5)],
     {"a": 0, "b": 48})

# 4. multi-turn: follow-up prompt = prompt(20) + 13 (resp. 12) outputs + 10.
#    Synthetic output ids of line i: (1<<62)|(i<<24)|j. The last sampled
#    token is never fed back (no KV), so 20+13-1=32 tokens are cached -> 32;
#    with 12 outputs 31 tokens -> one full block -> 16.
for n_out, exp in ((13, 32), (12, 16)):
    outs = [(1 << 62) | (0 << 24) | j for j in range(n_out)]
    case(f"followup_{n_out}",
         [dict(id="t1", arrival=0.0, tokens=P(20), output_tokens=n_out),
          dict(id="t2", arrival=10.0, tokens=P(20) + outs + P(10, 5000),
               output_tokens=4)],
         {"t1": 0, "t2": exp})

# 4b. same with explicit output_token_ids
outs = [777000 + j for j in range(13)]
case("followup_explicit_ids",
     [dict(id="t1", arrival=0.0, tokens=P(20), output_tokens=13,
           output_token_ids=outs),
      dict(id="t2", arrival=10.0, tokens=P(20) + outs + P(10, 5000),
           output_tokens=4)],
     {"t1": 0, "t2": 32})

# 5. prompt_logprobs requests never READ the cache (but still write it)
case("prompt_logprobs",
     [dict(id="a", arrival=0.0, tokens=P(64), output_tokens=3),
      dict(id="b", arrival=10.0, tokens=P(64), output_tokens=3,
           prompt_logprobs=True),
      dict(id="c", arrival=20.0, tokens=P(80), output_tokens=3,
           prompt_logprobs=True),
      dict(id="d", arrival=30.0, tokens=P(80), output_tokens=3)],
     {"a": 0, "b": 0, "c": 0, "d": 64})

# 6. LoRA name is part of every block hash
case("lora",
     [dict(id="a", arrival=0.0, tokens=P(64), output_tokens=3, lora="A"),
      dict(id="b", arrival=10.0, tokens=P(64), output_tokens=3, lora="A"),
      dict(id="c", arrival=20.0, tokens=P(64), output_tokens=3, lora="B"),
      dict(id="d", arrival=30.0, tokens=P(64), output_tokens=3)],
     {"a": 0, "b": 48, "c": 0, "d": 0})

# 7. block size 64: 128-token prompt twice -> 64 (127 // 64 * 64)
case("repeat_128_bs64",
     [dict(id="a", arrival=0.0, tokens=P(128), output_tokens=2),
      dict(id="b", arrival=10.0, tokens=P(128), output_tokens=2)],
     {"a": 0, "b": 64}, args=["--block-size", "64"])

with open(os.path.join(HERE, "expected.json"), "w") as f:
    json.dump(cases, f, indent=1)
print(f"wrote {len(cases)} cases")
