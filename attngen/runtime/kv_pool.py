"""Page pools as the kernels read them: one strided [num_pages, 2, ., ., D] view, from a pool or from K and V.

Every template reads key row (page, slot, head) at ``page * stride_page + slot * stride_slot + head *
stride_head`` from the pool's base and its value row ``stride_kv`` further (csrc/kv_rows.cuh), so a pool need
not be contiguous: vLLM's cache [2, num_pages, page_size, H, D] is ``cache.transpose(0, 1)``, and a pool may
keep gaps between pages. FlashInfer's other form, a pair ``(k_pages, v_pages)`` of [num_pages, page_size, H, D]
(NHD) or [num_pages, H, page_size, D] (HND) tensors, is accepted where both are views of one allocation with
the same strides, the values after the keys (``cache[0], cache[1]`` of such a cache): ``pool_of_pair`` makes
the 5-D view that spans both. Two separate allocations have no fixed distance to express, and are refused.

A pool the kernels read has its rows contiguous and 16-byte aligned, and its pages, halves, slots and heads
any positive multiples of 16 bytes apart without overlapping (checks.py ``pool_layout_error``).
"""
from __future__ import annotations

import numpy as np

from .checks import AttentionArgumentError, address, dtype_name, itemsize, strides_of, strides_where_they_count


def _allocation(x):
    """An identity of the memory x views: torch's storage address, NumPy's outermost base (through the objects
    as_strided leaves between a view and its array)."""
    if hasattr(x, "untyped_storage"):
        return ("torch", str(x.device), int(x.untyped_storage().data_ptr()))
    while getattr(x, "base", None) is not None:
        x = x.base
    return ("numpy", id(x))


def as_pool(pages, layout: str):
    """``pages`` as one [num_pages, 2, ...] pool: a pair (k_pages, v_pages) as ``pool_of_pair`` views it, a pool
    as it is."""
    if not isinstance(pages, (tuple, list)):
        return pages
    if len(pages) != 2:
        raise AttentionArgumentError(f"kv.pages: a pair (k_pages, v_pages) or one [num_pages, 2, ...] tensor, got a "
                                     f"sequence of {len(pages)}")
    return pool_of_pair(*pages, layout)


def pool_of_pair(k_pages, v_pages, layout: str):
    """The [num_pages, 2, ., ., D] view over K and V pages [num_pages, ., ., D] of one allocation (same shape,
    dtype, device and strides; the values after the keys); refuses anything else by name."""
    for name, t in (("k_pages", k_pages), ("v_pages", v_pages)):
        if not hasattr(t, "shape") or len(t.shape) != 4:
            raise AttentionArgumentError(
                f"kv.pages[{0 if name == 'k_pages' else 1}] ({name}): expected a 4-dim tensor [num_pages, "
                f"{'page_size, H_kv' if layout == 'NHD' else 'H_kv, page_size'}, head_dim] ({layout}), got "
                f"{getattr(t, 'shape', type(t).__name__)}")
    if tuple(k_pages.shape) != tuple(v_pages.shape) or dtype_name(k_pages) != dtype_name(v_pages):
        raise AttentionArgumentError(f"kv.pages: k_pages {tuple(k_pages.shape)} {dtype_name(k_pages)} and v_pages "
                                     f"{tuple(v_pages.shape)} {dtype_name(v_pages)} must have one shape and dtype")
    if strides_where_they_count(k_pages) != strides_where_they_count(v_pages):
        raise AttentionArgumentError(f"kv.pages: k_pages and v_pages must have the same strides ({strides_of(k_pages)} "
                                     f"vs {strides_of(v_pages)})")
    if _allocation(k_pages) != _allocation(v_pages):
        raise AttentionArgumentError(
            "kv.pages: k_pages and v_pages are separate allocations; the kernels read each value row at a fixed "
            "distance from its key row: keep K and V in one cache ([num_pages, 2, ...], or [2, num_pages, ...] "
            "passed as (cache[0], cache[1]) or as cache.transpose(0, 1))")
    item = itemsize(k_pages)
    gap = address(v_pages) - address(k_pages)
    if int(np.prod(k_pages.shape)) == 0:  # a pool of no pages (or empty pages) has nothing to find V by
        gap = max(1, int(np.prod(k_pages.shape[1:]))) * item
    if gap <= 0 or gap % item:
        raise AttentionArgumentError(
            "kv.pages: v_pages must lie after k_pages in their allocation (a view [num_pages, 2, ...] starts at "
            "the keys); pass (cache[0], cache[1]) of a cache whose keys come first")
    skv = gap // item
    shape = (int(k_pages.shape[0]), 2, *(int(s) for s in k_pages.shape[1:]))
    s = strides_of(k_pages)
    strides = (s[0], skv, *s[1:])
    if hasattr(k_pages, "as_strided"):
        return k_pages.as_strided(shape, strides, k_pages.storage_offset())
    if any(b % item for b in k_pages.strides):
        raise AttentionArgumentError(f"kv.pages: k_pages' byte strides {k_pages.strides} are not multiples of its "
                                     f"{item}-byte elements; pass np.ascontiguousarray copies")
    # (through raw bytes of the element size: as_strided cannot describe ml_dtypes' fp8 / bfloat16 elements)
    raw = k_pages.view(np.dtype((np.void, item)))
    return np.lib.stride_tricks.as_strided(raw, shape, (k_pages.strides[0], gap, *k_pages.strides[1:]),
                                           writeable=True).view(k_pages.dtype)


def same_pool(a, b) -> bool:
    """Whether two page pools are one view of one memory (the same tensor, or pools made from one pair)."""
    if a is b:
        return True
    return (type(a) is type(b) and _allocation(a) == _allocation(b) and address(a) == address(b)
            and tuple(a.shape) == tuple(b.shape) and strides_of(a) == strides_of(b) and dtype_name(a) == dtype_name(b))


def heads_adjacent(pages, layout: str) -> bool:
    """Whether a token's rows of consecutive KV heads lie back to back (an NHD pool whose head stride is its row),
    which a decode CTA serving two heads reads as one run (decode_plan.kv_heads_per_cta)."""
    heads = int(pages.shape[3] if layout == "NHD" else pages.shape[2])
    return layout == "NHD" and (heads <= 1 or strides_of(pages)[3] == int(pages.shape[4]))
