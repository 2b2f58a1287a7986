"""Writing a step's new keys and values into a paged cache, by the page table of the view that will read them.

FlashInfer's ``append_paged_kv_cache`` convention: the view (``PagedKV``) already counts the new tokens, so
request b's ``append_indptr[b+1] - append_indptr[b]`` new rows are the last ones of its KV length; their slots
follow from its page list. ``append_slots`` computes them on the host (``slot = page_id * page_size + place``)
and ``append_paged_kv`` writes the rows there in place: rows of the cache's own dtype as they are, rows into an
fp8 cache quantised with its scales (``fp8.append_paged_kv_fp8``). Torch pages on the GPU are written there.
"""
from __future__ import annotations

import numpy as np

from attngen.schedules.dtypes import is_fp8

from .checks import (AttentionArgumentError, as_numpy, check_indptr, check_layout, check_tensor, check_writable,
                     paged_lengths)
from .fp8 import append_paged_kv_fp8, check_no_scales
from .views import PagedKV, write_at_slots


def append_slots(kv: PagedKV, append_indptr) -> np.ndarray:
    """int64 [N] cache slots of the new rows: request b's ``append_indptr[b+1] - append_indptr[b]`` rows (N in
    all, ``append_indptr`` [B+1]) are the last of its KV length in ``kv`` (whose index arrays are read on the
    host: device arrays are copied back)."""
    if not isinstance(kv, PagedKV):
        raise AttentionArgumentError(f"kv: expected a PagedKV, got {type(kv).__name__}")
    check_layout(kv.layout, "kv.layout")
    indptr = check_indptr(kv.indptr, "kv.indptr", None).astype(np.int64)
    batch = len(indptr) - 1
    new = np.diff(check_indptr(append_indptr, "append_indptr", None, batch).astype(np.int64))
    indices = as_numpy(kv.indices, "kv.indices").astype(np.int64).reshape(-1)
    last = as_numpy(kv.last_page_len, "kv.last_page_len").astype(np.int64).reshape(-1)
    if len(last) != batch:
        raise AttentionArgumentError(f"kv.last_page_len: {len(last)} entries for {batch} requests")
    ps = kv.page_size
    if np.any((np.diff(indptr) > 0) & ((last < 1) | (last > ps))):
        raise AttentionArgumentError(f"kv.last_page_len: must be in [1, page_size={ps}] for every request that has "
                                     "pages")
    if indptr[-1] > len(indices):
        raise AttentionArgumentError(f"kv.indptr: ends at {indptr[-1]} but kv.indices holds {len(indices)} pages")
    lengths = paged_lengths(np.diff(indptr), last, ps)
    if np.any(new > lengths):
        b = int(np.argmax(new > lengths))
        raise AttentionArgumentError(
            f"append_indptr: request {b} appends {int(new[b])} rows but its view holds {int(lengths[b])} keys; the "
            "view must already count the new rows (FlashInfer's convention): grow last_page_len / the page list")
    request = np.repeat(np.arange(batch), new)
    first = np.cumsum(new) - new  # each request's first new row
    pos = np.arange(int(new.sum())) - first[request] + (lengths - new)[request]  # each new row's position
    page = indices[indptr[request] + pos // ps]
    num_pages = int(kv.pages.shape[0])
    if len(page) and (page.min() < 0 or page.max() >= num_pages):
        raise AttentionArgumentError(f"kv.indices: page ids of the new rows must be in [0, {num_pages})")
    slots = page * ps + pos % ps
    if len(np.unique(slots)) < len(slots):
        raise AttentionArgumentError("kv.indices: two new rows share a cache slot (a page listed twice, or in two "
                                     "requests): each appended row needs a slot of its own")
    return slots


def append_paged_kv(kv: PagedKV, k, v, append_indptr, *, k_scale=None, v_scale=None) -> None:
    """Write ``k``, ``v`` [N, Hkv, D] (N = append_indptr[-1]) into ``kv``'s pages in place at the slots
    ``append_slots`` gives. A 16-bit (or float32) cache takes rows of its own dtype; an fp8 cache quantises
    them with ``k_scale`` / ``v_scale`` (a float or one per KV head), as ``fp8.append_paged_kv_fp8``."""
    slots = append_slots(kv, append_indptr)
    pages = kv.pages
    check_writable(pages, "kv.pages", "pass a writable array (the rows are written into the cache in place)")
    if hasattr(pages, "detach") != hasattr(k, "detach") or hasattr(pages, "detach") != hasattr(v, "detach"):
        raise AttentionArgumentError("k, v: must be tensors of the pages' library (torch tensors for torch pages, "
                                     "NumPy arrays for NumPy pages)")
    if is_fp8(kv.kv_dtype):
        append_paged_kv_fp8(kv.pages, k, v, slots, k_scale=k_scale, v_scale=v_scale, layout=kv.layout)
        return
    check_no_scales(kv.kv_dtype, k_scale, v_scale)
    dtype = kv.kv_dtype
    heads, d = kv.num_kv_heads, int(kv.pages.shape[4])
    for name, x in (("k", k), ("v", v)):
        check_tensor(x, name, 3, dtype, strided="rows")
        if tuple(int(n) for n in x.shape) != (len(slots), heads, d):
            raise AttentionArgumentError(f"{name}: shape {tuple(x.shape)}, expected [{len(slots)}, {heads}, {d}] "
                                         "(the appended rows, the cache's heads and head_dim)")
    if hasattr(pages, "detach") and (k.device != pages.device or v.device != pages.device):
        raise AttentionArgumentError(f"k, v: on {k.device} / {v.device}, the pages on {pages.device}")
    for half, x in enumerate((k, v)):
        write_at_slots(pages, half, x, slots, kv.layout)
