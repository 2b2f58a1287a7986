"""Cost coefficients of the split-KV planner, per template: cost(chunk) = alpha * rows + beta * kv.

alpha is the cost of one query row of a tile relative to one key (beta = 1). decode's is
fitted by ``benchmarks/bench_cost_model.py`` on the H200 (a work item's fixed cost folded into
its rows at group 8: the per-key slope is 33.7 ns per CTA, an item's rows and start cost 13.1
keys per row plus 20.9 keys); prefill's is still provisional (a row's Q load and epilogue
weighed as one key's K/V load).
"""
from __future__ import annotations

COST = {
    # template: (alpha, beta)
    "decode": (15.7, 1.0),  # bench_cost_model.py, NVIDIA H200, 2026-11-29
    "prefill": (1.0, 1.0),
}


# keys: the shortest chunk a decode plan cuts (four stages of the tensor-core template); shorter chunks cost
# more in per-item overhead than they balance
DECODE_MIN_CHUNK = 256


def cost_coefficients(template: str) -> tuple[float, float]:
    if template not in COST:
        raise KeyError(f"no cost coefficients for template {template!r}; known: {sorted(COST)}")
    return COST[template]
