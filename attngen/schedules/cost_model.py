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


# keys: the shortest chunk a decode plan cuts, per head dim; it decides only where the batch's work per CTA
# slot is shorter (a small batch of short requests). H200, bf16, one request of 2k keys, Hq 32 / Hkv 8 (Hq 16 at
# D 256), microseconds by chunk length (decode_2026-12-03_chunks.md): D 64: 64 keys 7.45, 128 keys 7.94, 256
# keys 9.16; D 128: 64 keys 9.32, 128 keys 8.77, 256 keys 10.55; D 256: 128 keys 11.99, 256 keys 15.74. Shorter
# chunks than these cost more in per-item overhead (query load, partial state, merge) than they spread.
DECODE_MIN_CHUNK = {64: 64, 128: 128, 256: 128}


def decode_min_chunk(head_dim: int) -> int:
    """The shortest chunk (keys) a decode plan at ``head_dim`` cuts (DECODE_MIN_CHUNK; 128 for other dims)."""
    return DECODE_MIN_CHUNK.get(head_dim, 128)


def cost_coefficients(template: str) -> tuple[float, float]:
    if template not in COST:
        raise KeyError(f"no cost coefficients for template {template!r}; known: {sorted(COST)}")
    return COST[template]
