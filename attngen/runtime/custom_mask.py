"""Pack per-request boolean masks into the bit stream the ``custom_mask`` variant reads."""
from __future__ import annotations

import numpy as np


def pack_custom_mask(masks: list[np.ndarray], kv_lens: list[int]) -> dict[str, np.ndarray]:
    """masks[b]: bool [qo_len_b, kv_len_b] (row i = the request's i-th query).

    Returns the variant's params: ``mask_bits`` (uint8, little bit order),
    ``mask_offset`` and ``mask_stride`` (int32 [B]) such that the bit of (qo_pos, kv_pos)
    is ``mask_offset[b] + qo_pos * mask_stride[b] + kv_pos`` with qo_pos = kv_len - qo_len + i.
    """
    flat, offset, stride, start = [], [], [], 0
    for m, kv_len in zip(masks, kv_lens):
        m = np.asarray(m, dtype=bool)
        qo_len = m.shape[0]
        if m.shape[1] != kv_len:
            raise ValueError(f"mask has {m.shape[1]} columns, request has kv_len={kv_len}")
        first_pos = kv_len - qo_len
        offset.append(start - first_pos * kv_len)
        stride.append(kv_len)
        flat.append(m.reshape(-1))
        start += m.size
    bits = np.concatenate(flat) if flat else np.zeros(0, bool)
    if start >= 2**31:
        raise ValueError("custom masks larger than 2^31 bits are not supported")
    packed = np.packbits(bits, bitorder="little")
    if packed.size == 0:
        packed = np.zeros(1, np.uint8)
    return {"mask_bits": packed, "mask_offset": np.asarray(offset, np.int32),
            "mask_stride": np.asarray(stride, np.int32)}
