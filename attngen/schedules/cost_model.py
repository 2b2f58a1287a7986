"""Cost coefficients of the split-KV planner, per template: cost(chunk) = alpha * rows + beta * kv.

Provisional: alpha is the cost of one query row of a tile relative to one key, taken as
the ratio of a row's Q load and epilogue to a key's K/V load (about 1 for decode's D-element
rows). They are to be replaced by per-template fits of measured chunk times on each GPU.
"""
from __future__ import annotations

COST = {
    # template: (alpha, beta)
    "decode": (1.0, 1.0),
    "prefill": (1.0, 1.0),
}


# keys: the shortest chunk a decode plan cuts (four stages of the tensor-core template); shorter chunks cost
# more in per-item overhead than they balance
DECODE_MIN_CHUNK = 256


def cost_coefficients(template: str) -> tuple[float, float]:
    if template not in COST:
        raise KeyError(f"no cost coefficients for template {template!r}; known: {sorted(COST)}")
    return COST[template]
