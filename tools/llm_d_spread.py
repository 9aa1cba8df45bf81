"""How often a prefix-aware router sends a request of a shared-prefix group away from every replica
its group was already routed to, and whether it did so blind (issue 34 item 5, docs/cluster.md).

The synthetic shared-prefix workload names each request's group in ``session``
(``prefix-58/user-1``). For every point of a sweep folder this reads ``requests.parquet`` in
arrival order and counts, per point:

* ``replicas_per_group``: distinct replicas a group's requests ran on, averaged over the groups;
* ``sent_away``: requests routed to a replica none of the group's earlier requests went to (each
  one computes the shared context again, and holds a second copy of it);
* ``sent_away_blind``: those of them that arrived before any earlier request of the group had
  its first token, i.e. before the engine had computed the context and could announce it in KV
  events (the precise index's blind window; an approximate index records the pick at once).

Usage: ``python tools/llm_d_spread.py results/llm_d_inversion [--csv OUT]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def spread(requests: pd.DataFrame) -> dict[str, float]:
    """The three figures of the module docstring for one point's requests table."""
    df = requests.sort_values("arrival", kind="stable")
    groups = df["session"].str.split("/").str[0]
    replicas: dict[str, set[int]] = {}
    first_token: dict[str, float] = {}  # earliest first token of the group's earlier requests
    away = blind = 0
    for g, r, arrival, ft in zip(groups, df["replica"], df["arrival"], df["first_token"], strict=True):
        seen = replicas.setdefault(g, set())
        if seen and r not in seen:
            away += 1
            blind += first_token[g] > arrival
        seen.add(int(r))
        first_token[g] = min(first_token.get(g, float("inf")), float(ft))
    per_group = sum(len(s) for s in replicas.values()) / len(replicas) if replicas else 0.0
    return {"replicas_per_group": per_group, "sent_away": away, "sent_away_blind": blind}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep folder with table.csv and points/<key>/requests.parquet")
    ap.add_argument("--csv", type=Path, help="also write the figures here")
    args = ap.parse_args()
    table = pd.read_csv(args.sweep / "table.csv")
    rows = []
    for _, row in table.iterrows():
        axes = {k: row[k] for k in table.columns[1:] if k.startswith(("cluster.router", "workload.rate"))
                and "." in k and k.count(".") <= 1}
        rows.append({"point": row["point"], **axes,
                     **spread(pd.read_parquet(args.sweep / "points" / row["key"] / "requests.parquet"))})
    out = pd.DataFrame(rows)
    print(out.to_string(index=False))
    if args.csv:
        out.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
