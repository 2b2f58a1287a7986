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
# keys: the floor of a batch so small that the head dim's floor would leave at least 7 of every 8 plan columns (CTAs
# of one KV head) idle: one request of 512 keys at D 128 on the H200 (33 columns) runs 4 chunks of 128 keys in 8.31 us
# and 8 chunks of 64 keys in 7.42 (FlashInfer's best 8.18; decode_2026-12-03_chunks_b.md), while at 2k keys 16
# chunks of 128 keys stay ahead of 32 of 64 (8.73 against 9.39).
DECODE_TINY_BATCH_CHUNK = 64


def decode_min_chunk(head_dim: int, kv_lens=None, columns: int = 0) -> int:
    """The shortest chunk (keys) a decode plan at ``head_dim`` cuts (DECODE_MIN_CHUNK; 128 for other dims); given
    the batch's ``kv_lens`` [B] and the plan's ``columns`` (CTAs per KV head), a batch whose chunks at that floor
    would number at most an eighth of the columns is cut at DECODE_TINY_BATCH_CHUNK instead."""
    floor = DECODE_MIN_CHUNK.get(head_dim, 128)
    if kv_lens is not None and floor > DECODE_TINY_BATCH_CHUNK and 0 < 8 * len(kv_lens) <= columns:
        chunks = sum(max(1, -(-int(n) // floor)) for n in kv_lens)
        if 8 * chunks <= columns:
            return DECODE_TINY_BATCH_CHUNK
    return floor


def cost_coefficients(template: str) -> tuple[float, float]:
    if template not in COST:
        raise KeyError(f"no cost coefficients for template {template!r}; known: {sorted(COST)}")
    return COST[template]
