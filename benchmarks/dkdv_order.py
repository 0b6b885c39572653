"""The dK/dV kernel's tile keys by queries (as it is) against queries by keys, by tiles, the backward timed whole."""
import json
import sys
from dataclasses import astuple

import torch

sys.path.insert(0, "benchmarks")
import tune_ops as t  # noqa: E402

att = t.att
out = sys.argv[1]
rows = []
candidates = t._tiles((64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 8, 2))
for d in (128, 64):
    q, k, v = (torch.randn(4, 32, 4096, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    for causal in (False, True):
        flops = 4 * 4 * 32 * 4096 * 4096 * d * (0.5 if causal else 1.0)
        o, lse = att._forward(q, k, v, causal, d ** -0.5)

        def call():
            att._backward(do, q, k, v, o, lse, causal, d ** -0.5)

        current = att.TILES["dkdv"][d]
        for by_queries in (False, True):
            for tiles in [current] + [c for c in candidates if c != current]:
                row = dict(kernel="dkdv", d=d, causal=causal, tiles=[*astuple(tiles)],
                           order="queries by keys" if by_queries else "keys by queries",
                           current=not by_queries and tiles == current, timed="backward (delta, dK/dV, dQ)")
                rows.append(t._attention_row(row, call, 2.5 * flops, o, None, DKDV_BY_QUERIES=by_queries,
                                             TILES={**att.TILES, "dkdv": {**att.TILES["dkdv"], d: tiles}}))
json.dump({"dkdv-order": rows}, open(f"{out}/dkdv-order.json", "w"), indent=1)
