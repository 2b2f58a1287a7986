"""A NumPy reference of the prefill tile classifier (csrc/tile_map.cuh), for the CPU and GPU tests."""
import numpy as np


def reference_tile_classes(visible, qo_lens, kv_lens, *, group: int, num_kv_heads: int, rows: int, keys: int,
                           reads_heads: bool, causal: bool = False) -> np.ndarray:
    """[B, heads, q_tiles, k_tiles] uint8 (0 empty, 1 partial, 2 full) of ``visible(b, qo_pos, kv_pos, qo_head,
    kv_head) -> bool`` (the mask hook's meaning) over the templates' packed rows (row = token * group + head).
    ``reads_heads``: the mask reads a head index, so every KV head has its map (heads = num_kv_heads) and every
    query head of a group is evaluated; else one map (heads = 1) evaluated for head 0 of each token."""
    heads = num_kv_heads if reads_heads else 1
    batch = len(qo_lens)
    q_tiles = -(-max(qo_lens, default=0) * group // rows)
    k_tiles = -(-max(kv_lens, default=0) // keys)
    out = np.zeros((batch, heads, q_tiles, k_tiles), np.uint8)
    for b in range(batch):
        n_rows, kv_len = qo_lens[b] * group, kv_lens[b]
        pos_base = kv_len - qo_lens[b]
        for hm in range(heads):
            hk = hm if reads_heads else 0
            for t in range(q_tiles):
                rs = range(t * rows, min((t + 1) * rows, n_rows))
                if not rs:
                    continue
                for k in range(k_tiles):
                    seen = [
                        j < kv_len and (not causal or j <= pos_base + r // group)
                        and visible(b, pos_base + r // group, j, hk * group + (r % group if reads_heads else 0), hk)
                        for r in rs for j in range(k * keys, (k + 1) * keys)]
                    out[b, hm, t, k] = 2 if all(seen) else (1 if any(seen) else 0)
    return out


def decode_lists(indptr: np.ndarray, entries: np.ndarray, shape) -> np.ndarray:
    """The map a plan's compacted lists stand for (empty tiles 0)."""
    flat = np.zeros((int(np.prod(shape[:3])), shape[3]), np.uint8)
    for i in range(len(indptr) - 1):
        for e in entries[indptr[i]:indptr[i + 1]]:
            flat[i, e >> 1] = 2 if e & 1 else 1
    return flat.reshape(shape)
