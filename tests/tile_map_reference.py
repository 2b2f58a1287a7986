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


def reference_row_keys(visible, qo_lens, kv_lens, *, group: int, num_kv_heads: int, rows: int, reads_heads: bool,
                       causal: bool = False) -> np.ndarray:
    """[B, heads, q_tiles, rows, 2] int32: each map row's visible keys over the whole request, as the classifier
    records them (``row_keys``) for ``visible(b, qo_pos, kv_pos, qo_head, kv_head) -> bool``.

    Map row i of query tile t is the token ``t * rows // group + i`` of a head-free map (``reads_heads`` false:
    heads = 1, evaluated for query head 0), else the packed row ``t * rows + i`` (token = row // group, query
    head = kv_head * group + row % group). A row counts only if it exists: a head-free map's tokens up to the
    one of the tile's last existing packed row, a head-reading map's packed rows below qo_len * group. A key j
    is visible when j < kv_len, j <= pos under ``causal`` (pos = kv_len - qo_len + token) and ``visible`` says
    so. The value is (lo, hi) when the visible keys are exactly lo..hi, (0, -1) when there is none or the row
    does not exist, (-1, -1) when they are not one interval."""
    heads = num_kv_heads if reads_heads else 1
    batch = len(qo_lens)
    q_tiles = -(-max(qo_lens, default=0) * group // rows)
    out = np.zeros((batch, heads, q_tiles, rows, 2), np.int32)
    out[..., 1] = -1
    for b in range(batch):
        qo_len, kv_len = qo_lens[b], kv_lens[b]
        n_rows = qo_len * group  # packed rows of the request
        pos_base = kv_len - qo_len
        for hm in range(heads):
            hk = hm if reads_heads else 0
            for t in range(q_tiles):
                row0 = t * rows
                if row0 >= n_rows:
                    continue  # the whole tile lies past the request's end
                last_row = min(row0 + rows, n_rows) - 1
                for i in range(rows):
                    if reads_heads:
                        r = row0 + i
                        if r > last_row:
                            continue
                        token, qo_head = r // group, hk * group + r % group
                    else:
                        token = row0 // group + i
                        if token > last_row // group:
                            continue
                        qo_head = 0
                    pos = pos_base + token
                    seen = [j for j in range(kv_len)
                            if (not causal or j <= pos) and visible(b, pos, j, qo_head, hk)]
                    if not seen:
                        continue  # (0, -1)
                    lo, hi = seen[0], seen[-1]
                    out[b, hm, t, i] = (lo, hi) if len(seen) == hi - lo + 1 else (-1, -1)
    return out


def decode_lists(indptr: np.ndarray, entries: np.ndarray, shape) -> np.ndarray:
    """The map a plan's compacted lists stand for (empty tiles 0)."""
    flat = np.zeros((int(np.prod(shape[:3])), shape[3]), np.uint8)
    for i in range(len(indptr) - 1):
        for e in entries[indptr[i]:indptr[i + 1]]:
            flat[i, e >> 1] = 2 if e & 1 else 1
    return flat.reshape(shape)
