"""Argument checks run before any kernel launch: each error names the argument and the fix.

The base of the runtime's modules: it imports none of them (the views it checks are read by
their fields).
"""
from __future__ import annotations

import math

import numpy as np

from attngen.ir.int_arithmetic import MAX_POSITION


class AttentionArgumentError(ValueError):
    pass


# a uint8 K/V tensor does not say which fp8 format its bits hold (runtime/fp8.py)
FP8_BITS_HINT = ("; if it holds fp8 bits, pass it viewed as its format (x.view(torch.float8_e4m3fn) / "
                 "x.view(ml_dtypes.float8_e4m3fn), or float8_e5m2)")


def as_numpy(x, name: str) -> np.ndarray:
    """Read-only NumPy view of an index array (numpy or CPU torch), for host-side checks."""
    if hasattr(x, "detach"):
        if x.device.type != "cpu":
            x = x.cpu()
        x = x.detach().numpy()
    if not isinstance(x, np.ndarray):
        raise AttentionArgumentError(f"{name}: expected a numpy array or torch tensor, got {type(x).__name__}")
    return x


def dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def check_tensor(x, name: str, ndim: int, dtype: str | None = None, *, strided: str | None = None) -> None:
    """``strided``: None, the tensor must be contiguous; "tokens" (queries [n, H, D]): a token's heads packed,
    tokens any multiple of 16 bytes apart (the view of a fused QKV projection); "rows" (ragged keys or values
    [n, H, D]): rows contiguous, tokens (the outer dim) and heads any non-overlapping multiples of 16 bytes
    apart; "pages" (a page pool [P, 2, ., ., D]): any layout ``pool_layout_error`` accepts; "any": any layout
    (a backend that packs its inputs itself)."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise AttentionArgumentError(f"{name}: expected a tensor, got {type(x).__name__}")
    device = getattr(x, "device", None)
    if getattr(device, "type", None) == "meta":  # torch's shape-only tensors hold no data to read
        raise AttentionArgumentError(f"{name}: is on torch's 'meta' device (it holds no data); pass a tensor on the "
                                     "device the module runs on")
    if len(x.shape) != ndim:
        raise AttentionArgumentError(f"{name}: expected {ndim} dims, got shape {tuple(x.shape)}")
    if dtype is not None and dtype_name(x) != dtype:
        hint = FP8_BITS_HINT if dtype_name(x) == "uint8" and name.startswith("kv.") else ""
        raise AttentionArgumentError(f"{name}: expected dtype {dtype}, got {dtype_name(x)}{hint}")
    if strided == "pages":
        why = pool_layout_error(x)
        if why:
            raise AttentionArgumentError(f"{name}: the kernels cannot read this page pool in place: {why}; pass "
                                         "pages.contiguous() (or a view whose rows are contiguous and 16-byte aligned)")
        return
    contiguous = x.is_contiguous() if hasattr(x, "is_contiguous") else x.flags["C_CONTIGUOUS"]
    if not contiguous and strided != "any" and (strided is None or not _strides_serve(x, strided)):
        what = {None: "must be contiguous", "tokens": "must be contiguous, or a view whose tokens' heads are packed "
                "and whose tokens lie a multiple of 16 bytes apart",
                "rows": "must be contiguous, or a view whose rows are contiguous, with tokens (the outer dim) and "
                "heads a multiple of 16 bytes apart without overlapping"}[strided]
        raise AttentionArgumentError(f"{name}: {what}; strides {tuple(strides_of(x))} (call .contiguous() / "
                                     "np.ascontiguousarray)")


def strides_where_they_count(x) -> tuple:
    """x's strides in elements, None along dims of size 1 (where any stride reads the same elements)."""
    return tuple(s if int(n) > 1 else None for s, n in zip(strides_of(x), x.shape))


def strides_of(x) -> tuple:
    """x's strides in elements (torch or NumPy)."""
    if hasattr(x, "stride") and callable(x.stride):
        return tuple(x.stride())
    return tuple(s // x.itemsize for s in x.strides)


def _strides_serve(x, strided: str) -> bool:
    """Whether a non-contiguous [n, H, D] tensor's strides serve as ``strided`` says (check_tensor)."""
    n, h, d = (int(s) for s in x.shape)
    sn, sh, sd = strides_of(x)
    unit = 16 // math.gcd(16, itemsize(x))  # elements of 16 bytes
    if d > 1 and sd != 1:
        return False
    if strided == "tokens":
        return (h <= 1 or sh == d) and (n <= 1 or (sn >= h * d and sn % unit == 0))
    head_ok = h <= 1 or (sh >= d and sh % unit == 0)
    return head_ok and (n <= 1 or (sn >= (h - 1) * max(sh, 0) + d and sn % unit == 0))


def itemsize(x) -> int:
    return int(x.element_size()) if hasattr(x, "element_size") else int(x.itemsize)


def address(x) -> int:
    """The byte address of x's first element (torch or NumPy)."""
    return int(x.data_ptr()) if hasattr(x, "data_ptr") else int(x.__array_interface__["data"][0])


def pool_layout_error(pages) -> str | None:
    """Why the kernels cannot read a 5-D page pool [P, 2, ., ., D] in place (None: they can): its rows [D]
    contiguous, its address and every other stride (along dims of more than one element) positive multiples of
    16 bytes, and no two rows overlapping (csrc/kv_rows.cuh reads any such strides; runtime/kv_pool.py)."""
    contiguous = pages.is_contiguous() if hasattr(pages, "is_contiguous") else pages.flags["C_CONTIGUOUS"]
    if contiguous and int(pages.shape[4]) * itemsize(pages) % 16 == 0 and address(pages) % 16 == 0:
        return None  # (a packed pool of 16-byte rows: every stride a multiple of the row; the per-call case)
    shape = tuple(int(s) for s in pages.shape)
    strides = strides_of(pages)
    unit = 16 // math.gcd(16, itemsize(pages))  # elements of 16 bytes
    if shape[4] > 1 and strides[4] != 1:
        return f"its rows [head_dim] are not contiguous (strides {strides})"
    if address(pages) % 16:
        return "it does not start on a 16-byte aligned address"
    dims = [(strides[i], shape[i]) for i in range(4) if shape[i] > 1]
    if any(s <= 0 or s % unit for s, _ in dims):
        return (f"its pages, halves, slots and heads must lie positive multiples of 16 bytes apart (strides "
                f"{strides}, in elements of {itemsize(pages)} bytes)")
    extent = shape[4]  # a row; then, by rising stride, each dim's step must clear what lies below it
    for s, n in sorted(dims):
        if s < extent:
            return f"its rows overlap (strides {strides} for shape {shape})"
        extent = s * (n - 1) + extent
    return None


def read_only(x) -> bool:
    """Whether x is a NumPy array that may not be written (DLPack cannot export one; torch tensors always may)."""
    return isinstance(x, np.ndarray) and not x.flags.writeable


def check_writable(x, name: str, fix: str = "pass a writable array (x.copy())") -> None:
    """Refuse a read-only NumPy array where the call writes into ``name``."""
    if read_only(x):
        raise AttentionArgumentError(f"{name}: is a read-only NumPy array, and the call writes into it; {fix}")


def check_integers(a: np.ndarray, name: str) -> None:
    """Refuse a host array of ids or sizes that does not hold integers (a float array would be truncated); an
    empty one may have any dtype (``np.asarray([])`` is float64)."""
    if a.size and a.dtype.kind not in "iu":
        raise AttentionArgumentError(f"{name}: must hold integers (an int32 array), got dtype {a.dtype}; convert it "
                                     "with .astype(np.int32) after checking its values are whole numbers")


def check_indptr(x, name: str, total: int | None, batch: int | None = None, *, capacity: bool = False,
                 queries: bool = False) -> np.ndarray:
    """``capacity``: ``total`` is the size of a buffer the entries index into, which may hold unused
    spare entries past the last one (as a CUDA-graph-captured page table does). ``queries``: the rows are query
    tokens, each request fewer than MAX_POSITION (check_request_lengths)."""
    check_tensor(x, name, 1, "int32")
    a = as_numpy(x, name)
    if len(a) < 1:
        raise AttentionArgumentError(f"{name}: needs at least one entry ([B+1] with B >= 0)")
    if batch is not None and len(a) != batch + 1:
        raise AttentionArgumentError(f"{name}: has {len(a)} entries, expected batch_size + 1 = {batch + 1}")
    if a[0] != 0 or np.any(np.diff(a) < 0):
        raise AttentionArgumentError(f"{name}: must start at 0 and be non-decreasing")
    if capacity and total is not None and a[-1] > total:
        raise AttentionArgumentError(f"{name}: last entry is {a[-1]} but the indexed buffer holds only {total} "
                                     "entries")
    if not capacity and total is not None and a[-1] != total:
        raise AttentionArgumentError(f"{name}: last entry is {a[-1]} but the data holds {total} rows")
    if queries:
        check_request_lengths(np.diff(a), name, "queries")
    return a


def check_qkv_heads(q, num_kv_heads: int, head_dim: int) -> None:
    n_qo = int(q.shape[1])
    if n_qo == 0:
        raise AttentionArgumentError(f"q: has no heads (shape {tuple(q.shape)}); pass q [tokens, num_qo_heads, "
                                     "head_dim] with num_qo_heads a positive multiple of num_kv_heads")
    if q.shape[2] != head_dim:
        raise AttentionArgumentError(f"q: head_dim is {q.shape[2]}, this module was built for {head_dim}")
    if num_kv_heads == 0 or n_qo % num_kv_heads:
        raise AttentionArgumentError(
            f"q has {n_qo} heads and the KV cache {num_kv_heads}: num_qo_heads must be a multiple of "
            "num_kv_heads (GQA)")


def check_layout(layout, name: str = "layout") -> None:
    if layout not in ("NHD", "HND"):
        raise AttentionArgumentError(f"{name}: {layout!r} is not 'NHD' or 'HND'")


def check_paged(kv, head_dim: int, dtype: str, batch: int | None, *, strided: str = "pages") -> int:
    """Checks of a ``PagedKV`` for a call with ``batch`` requests (None: any); returns the batch size.
    ``strided``: the pools the backend reads (check_tensor: "pages", or "any" for one that packs them itself)."""
    check_layout(kv.layout, "kv.layout")
    check_tensor(kv.pages, "kv.pages", 5, dtype, strided=strided)
    if kv.pages.shape[1] != 2 or kv.pages.shape[4] != head_dim:
        raise AttentionArgumentError(
            f"kv.pages: shape {tuple(kv.pages.shape)} is not [num_pages, 2, ..., {head_dim}] ({kv.layout})")
    check_tensor(kv.indices, "kv.indices", 1, "int32")
    indptr = check_indptr(kv.indptr, "kv.indptr", int(kv.indices.shape[0]), batch, capacity=True)
    b = len(indptr) - 1
    check_tensor(kv.last_page_len, "kv.last_page_len", 1, "int32")
    if kv.last_page_len.shape[0] != b:
        raise AttentionArgumentError(f"kv.last_page_len: has {kv.last_page_len.shape[0]} entries, expected {b}")
    idx = as_numpy(kv.indices, "kv.indices")[:int(indptr[-1])]  # entries past the last are spare capacity
    n_pages = int(kv.pages.shape[0])
    if len(idx) and (idx.min() < 0 or idx.max() >= n_pages):
        raise AttentionArgumentError(
            f"kv.indices: page id {int(idx.max()) if idx.max() >= n_pages else int(idx.min())} is outside "
            f"the cache's {n_pages} pages")
    last = as_numpy(kv.last_page_len, "kv.last_page_len")
    has_pages = np.diff(indptr) > 0
    if np.any(has_pages & ((last < 1) | (last > kv.page_size))):
        raise AttentionArgumentError(f"kv.last_page_len: must be in [1, page_size={kv.page_size}] for "
                                     "every request that has pages")
    check_request_lengths(paged_lengths(np.diff(indptr).astype(np.int64), last, kv.page_size), "kv.indptr")
    return b


def paged_lengths(n_pages, last_page_len, page_size: int):
    """Keys of paged requests (numpy arrays or scalars): full pages plus the last page's valid slots, 0 for a
    request without pages."""
    return np.where(np.asarray(n_pages) > 0, (np.asarray(n_pages) - 1) * page_size + np.asarray(last_page_len), 0)


def check_ragged(kv, head_dim: int, dtype: str, batch: int | None, *, strided: str = "rows") -> int:
    """Checks of a ``RaggedKV`` for a call with ``batch`` requests (None: any); returns the batch size.
    ``strided``: the layouts the backend reads (check_tensor; "any" for one that packs them itself)."""
    check_tensor(kv.k, "kv.k", 3, dtype, strided=strided)
    check_tensor(kv.v, "kv.v", 3, dtype, strided=strided)
    if tuple(kv.k.shape) != tuple(kv.v.shape) or kv.k.shape[2] != head_dim:
        raise AttentionArgumentError(f"kv.k/kv.v: shapes {tuple(kv.k.shape)} / {tuple(kv.v.shape)} must match "
                                     f"and end in head_dim={head_dim}")
    if strided != "any" and strides_where_they_count(kv.k) != strides_where_they_count(kv.v):
        raise AttentionArgumentError(f"kv.k/kv.v: strides {strides_of(kv.k)} / {strides_of(kv.v)} must match (views "
                                     "of one fused projection do; else call .contiguous() on both)")
    indptr = check_indptr(kv.indptr, "kv.indptr", int(kv.k.shape[0]), batch)
    check_request_lengths(np.diff(indptr), "kv.indptr")
    return len(indptr) - 1


def check_request_lengths(lens: np.ndarray, name: str, what: str = "keys") -> None:
    """Refuse a request of MAX_POSITION ``what`` (keys, or queries) or more (lens: [B] per request, host): hooks read
    positions as int32 strictly within +-MAX_POSITION (ir/int_arithmetic.py)."""
    longest = int(np.max(lens, initial=0))
    if longest >= MAX_POSITION:
        raise AttentionArgumentError(f"{name}: a request of {longest} {what}; requests hold fewer than 2^29 "
                                     f"({MAX_POSITION}) queries and keys, whose positions hooks read as int32: check "
                                     f"{name}" + (" (and the page table it indexes)" if what == "keys" else ""))
