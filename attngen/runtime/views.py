"""Views of the KV cache passed to attention calls (grouped, never long positional lists)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attngen.ir.hook_spec import POSITIONS

from .checks import AttentionArgumentError, as_numpy, check_integers, check_layout, dtype_name, paged_lengths
from .kv_pool import as_pool
from .module import int32_like

Tensor = Any  # numpy.ndarray or torch.Tensor


def _tensor(x, name: str, ndim: int):
    """x, refused by name unless a tensor of ``ndim`` dims (what a view's properties read before the calls' checks)."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise AttentionArgumentError(f"{name}: expected a tensor, got {type(x).__name__}")
    if len(x.shape) != ndim:
        raise AttentionArgumentError(f"{name}: expected {ndim} dims, got shape {tuple(x.shape)}")
    return x


@dataclass(frozen=True)
class PagedKV:
    """A paged KV cache and one batch's page table in CSR form. ``pages`` may be strided (rows contiguous;
    vLLM's [2, num_pages, ...] cache as ``cache.transpose(0, 1)``), or a pair ``(k_pages, v_pages)`` of views
    of one allocation, which becomes the one [num_pages, 2, ...] view spanning both (kv_pool.py)."""

    pages: Tensor  # [num_pages, 2, page_size, H_kv, D] (NHD) or [num_pages, 2, H_kv, page_size, D] (HND)
    indptr: Tensor  # [B+1] int32, request b owns indices[indptr[b]:indptr[b+1]]
    indices: Tensor  # [nnz] int32, page ids
    last_page_len: Tensor  # [B] int32, valid slots of each request's last page (1..page_size)
    layout: str = "NHD"

    def __post_init__(self):
        if isinstance(self.pages, (tuple, list)):
            object.__setattr__(self, "pages", as_pool(self.pages, self.layout))

    @property
    def page_size(self) -> int:
        pages = _tensor(self.pages, "kv.pages", 5)
        return int(pages.shape[2] if self.layout == "NHD" else pages.shape[3])

    @property
    def num_kv_heads(self) -> int:
        pages = _tensor(self.pages, "kv.pages", 5)
        return int(pages.shape[3] if self.layout == "NHD" else pages.shape[2])

    @property
    def kv_dtype(self) -> str:
        """The cache's element type (an fp8 format for a quantised cache, see ``fp8.py``)."""
        return dtype_name(_tensor(self.pages, "kv.pages", 5))


@dataclass(frozen=True)
class RaggedKV:
    """Keys and values of a batch stored back to back."""

    k: Tensor  # [total_kv, H_kv, D]
    v: Tensor  # [total_kv, H_kv, D]
    indptr: Tensor  # [B+1] int32

    @property
    def num_kv_heads(self) -> int:
        return int(_tensor(self.k, "kv.k", 3).shape[1])

    @property
    def kv_dtype(self) -> str:
        """The keys' element type (an fp8 format for quantised keys and values, see ``fp8.py``)."""
        return dtype_name(_tensor(self.k, "kv.k", 3))


def write_at_slots(pages: Tensor, half: int, rows: Tensor, slots: np.ndarray, layout: str) -> None:
    """pages [P, 2, S, Hkv, D] (NHD) or [P, 2, Hkv, S, D] (HND), in place: ``rows`` [N, Hkv, D] into half ``half``
    (0 keys, 1 values) at cache slots ``slots`` [N] (page ``slot // S``, place ``slot % S``; host int64). Torch
    pages are written where they lie (the slots copied to their device)."""
    page_size = int(pages.shape[2] if layout == "NHD" else pages.shape[3])
    page, place = slots // page_size, slots % page_size
    if hasattr(pages, "detach"):
        import torch

        page, place = torch.as_tensor(page, device=pages.device), torch.as_tensor(place, device=pages.device)
    if layout == "NHD":
        pages[page, half, place] = rows
    else:
        pages[page, half, :, place] = rows


def host_kv_lengths(kv) -> np.ndarray:
    """[B] keys of each request of a paged or ragged view, from host copies of its index arrays (numpy, or torch
    on any device)."""
    indptr = np.diff(as_numpy(kv.indptr, "kv.indptr")).astype(np.int64)
    if isinstance(kv, PagedKV):
        return paged_lengths(indptr, as_numpy(kv.last_page_len, "kv.last_page_len").astype(np.int64), kv.page_size)
    return indptr


def longest_kv(kv) -> int:
    """The longest request's KV length of a view whose index arrays are on the host (numpy or CPU torch)."""
    return int(np.max(host_kv_lengths(kv), initial=0))


def hook_readers(variant, indices: tuple[str, ...]) -> list[str]:
    """``"<hook> reads <index>"`` for every hook of ``variant`` that reads one of the standard ``indices``."""
    return [f"{hook} reads {idx}" for hook, r in variant.analysis.reads.items() for idx in r.indices
            if idx in indices]


def causal_only(variant) -> bool:
    """Whether ``variant`` reads positions in its mask alone, and the mask is exactly ``kv_pos <= qo_pos``: views
    that renumber keys serve it where they keep its relative order (cascade levels, diagonal blocks)."""
    from attngen.ir.mask_class import MaskKind

    others = [r for r in hook_readers(variant, POSITIONS) if not r.startswith("logits_mask ")]
    return "logits_mask" in variant.hooks and variant.analysis.mask.kind == MaskKind.CAUSAL and not others


def causal_blocks(indptr: np.ndarray, indices: np.ndarray, row_sz: np.ndarray, col_sz: np.ndarray,
                  where: str = "") -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], np.ndarray]:
    """A BSR layout (host int32 indptr [MB+1], indices [nnz]) under a causal mask, with the key blocks after each
    block row's diagonal dropped (nothing there is visible), split in two layouts over the same block rows:
    ``aligned``, the rows that read their diagonal block (last) or nothing, which the causal variant serves (the
    paged prefill's alignment, a request's last query row at its last key, is then the causal one, and every
    earlier block is seen whole); ``whole``, the rows that read blocks before their diagonal but not it, every
    key of which is visible (a variant without the mask serves them). Each layout leaves the other's rows
    empty; ``whole_rows`` [MB] bool marks the second kind. Block row i must be as large as key block i (square
    blocks on the diagonal)."""
    rows, cols = np.asarray(row_sz), np.asarray(col_sz)
    if len(rows) != len(cols):
        raise AttentionArgumentError(
            f"view{where}: a causal variant needs square blocks on the diagonal (block row i as large as key block "
            f"i; a shared view: R = C and M = N), got {len(rows)} block rows and {len(cols)} key blocks")
    if np.any(rows != cols):
        i = int(np.argmax(rows != cols))
        raise AttentionArgumentError(
            f"view{where}: a causal variant needs square blocks on the diagonal (block row i as large as key block "
            f"i; a shared view: R = C and M = N), got block row {i} of {int(rows[i])} rows and key block {i} of "
            f"{int(cols[i])}")
    layouts = ([0], []), ([0], [])  # (indptr, indices) of the aligned rows, of the wholly visible rows
    whole_rows = np.zeros(len(rows), bool)
    for i in range(len(rows)):
        row = indices[indptr[i]:indptr[i + 1]]
        row = row[row <= i]
        whole_rows[i] = len(row) > 0 and row[-1] != i
        for kind, (ip, ix) in enumerate(layouts):
            if kind == int(whole_rows[i]):
                ix.extend(row.tolist())
            ip.append(len(ix))
    (ip_a, ix_a), (ip_w, ix_w) = layouts
    return ((np.array(ip_a, np.int32), np.array(ix_a, np.int32)), (np.array(ip_w, np.int32), np.array(ix_w, np.int32)),
            whole_rows)


def require_position_free(variant, view: str) -> None:
    """Views that renumber keys (cascade levels, block-sparse rows) serve only variants whose hooks
    never read a position."""
    readers = hook_readers(variant, POSITIONS)
    if readers:
        raise AttentionArgumentError(
            f"variant '{variant.name}': {', '.join(readers)}; {view} number keys from 0 in every view, so "
            "position-dependent variants must use the flat view")


def check_bsr(indptr, indices, num_key_blocks: int, where: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Host int32 copies of one BSR layout, checked. ``where`` names the head (``"[2]"``) in errors.

    indptr: [MB+1], from 0, non-decreasing, ending at nnz; indices: [nnz] key-block ids in
    [0, num_key_blocks), strictly ascending within each block row (a repeated block would count twice).
    """
    ip, ix = np.asarray(as_numpy(indptr, f"indptr{where}")), np.asarray(as_numpy(indices, f"indices{where}"))
    check_integers(ip, f"indptr{where}")
    check_integers(ix, f"indices{where}")
    ip, ix = ip.astype(np.int64).reshape(-1), ix.astype(np.int64).reshape(-1)
    if len(ip) < 1 or ip[0] != 0 or np.any(np.diff(ip) < 0) or ip[-1] != len(ix):
        raise AttentionArgumentError(f"indptr{where}: must start at 0, be non-decreasing and end at "
                                     f"len(indices{where}) = {len(ix)}; got {np.array2string(ip, threshold=8)}")
    if len(ix) and (ix.min() < 0 or ix.max() >= num_key_blocks):
        bad = int(ix.max()) if ix.max() >= num_key_blocks else int(ix.min())
        raise AttentionArgumentError(f"indices{where}: key block ids must be in [0, {num_key_blocks}), "
                                     f"got {bad}")
    crosses_row = np.zeros(max(len(ix) - 1, 0), bool)
    row_starts = ip[1:-1][(ip[1:-1] > 0) & (ip[1:-1] < len(ix))]
    crosses_row[row_starts - 1] = True
    bad = np.nonzero((np.diff(ix) <= 0) & ~crosses_row)[0]
    if len(bad):
        row = int(np.searchsorted(ip, bad[0] + 1, side="right") - 1)
        raise AttentionArgumentError(f"indices{where}: block row {row} lists key blocks out of order or twice "
                                     f"({ix[ip[row]:ip[row + 1]].tolist()}); sort each row's ids ascending "
                                     "without repeats")
    return ip.astype(np.int32), ix.astype(np.int32)


def bsr_page_table(indptr: np.ndarray, indices: np.ndarray, block_col_sz: np.ndarray,
                   page_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The paged-KV page table of a checked BSR layout: block row i becomes request i.

    indptr: [MB+1]; indices: [nnz] ascending per row; block_col_sz: [NB] key rows of each block, stored
    back to back from key 0 in pages of ``page_size`` rows. Every block but the last must fill whole
    pages; the last may end partway, which ascending ids put last in any row listing it.
    Returns (kv_indptr [MB+1], kv_indices [pages read], last_page_len [MB], 0 for empty rows), int32.
    """
    sz = np.asarray(block_col_sz, np.int64)
    first_page = np.concatenate([[0], np.cumsum(sz)[:-1]]) // page_size
    n_pages = -(-sz // page_size)
    per_entry = n_pages[indices]
    ends = np.concatenate([[0], np.cumsum(per_entry)])
    kv_indices = (np.arange(ends[-1]) - np.repeat(ends[:-1], per_entry)
                  + np.repeat(first_page[indices], per_entry))
    last = np.zeros(len(indptr) - 1, np.int64)
    rows = np.nonzero(np.diff(indptr) > 0)[0]
    last_block = indices[indptr[rows + 1] - 1]
    last[rows] = sz[last_block] - (n_pages[last_block] - 1) * page_size
    return ends[indptr].astype(np.int32), kv_indices.astype(np.int32), last.astype(np.int32)


@dataclass(frozen=True)
class BlockSparseView:
    """Block-sparse attention (BSR): query rows in blocks of R, keys in blocks of C, one layout for all heads.

    The keys live in a paged cache whose pages hold C rows each (page j = key block j), so the
    view is only a page table: block row i reads the key blocks ``indices[indptr[i]:indptr[i+1]]``.
    ``HeadwiseBlockSparseView`` (block_sparse.py) gives each KV head its own layout.
    """

    indptr: Any  # [MB+1] int32, MB = ceil(num_q_rows / R)
    indices: Any  # [nnz] int32 key-block ids, strictly ascending within a block row
    block_rows: int  # R
    num_q_rows: int  # M
    num_kv_rows: int  # N: the last key block may hold fewer than C rows

    def __post_init__(self):
        for name, least in (("block_rows", 1), ("num_q_rows", 0), ("num_kv_rows", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
                raise AttentionArgumentError(f"{name}: must be an integer of at least {least}, got {value!r}")

    def blocks(self, pages, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The checked layout over ``pages`` (C = the pages' rows): host indptr [MB+1], indices [nnz], the block
        rows' sizes [MB] and the key blocks' sizes [NB] (the last of each may be partial)."""
        check_layout(layout)
        c = int(pages.shape[2] if layout == "NHD" else pages.shape[3])
        n_blocks = -(-self.num_kv_rows // c)
        mb = -(-self.num_q_rows // self.block_rows)
        n_indptr = len(as_numpy(self.indptr, "indptr"))
        if n_indptr != mb + 1:
            raise AttentionArgumentError(f"indptr: has {n_indptr} entries, expected ceil(M/R) + 1 = {mb + 1}")
        indptr, indices = check_bsr(self.indptr, self.indices, n_blocks)
        row_sz = np.minimum(self.block_rows, self.num_q_rows - np.arange(mb) * self.block_rows)
        col_sz = np.minimum(c, self.num_kv_rows - np.arange(n_blocks) * c)
        return indptr, indices, row_sz, col_sz

    def as_paged(self, pages, layout: str = "NHD") -> tuple[Any, PagedKV]:
        """(qo_indptr [MB+1], PagedKV) running the view through the paged prefill kernels."""
        indptr, indices, row_sz, col_sz = self.blocks(pages, layout)
        c, n_blocks = int(pages.shape[2] if layout == "NHD" else pages.shape[3]), len(col_sz)
        if int(pages.shape[0]) < n_blocks:
            raise AttentionArgumentError(f"pages: holds {pages.shape[0]} blocks of {c} rows, the view needs {n_blocks}")
        kv_indptr, kv_indices, last = bsr_page_table(indptr, indices, col_sz, c)
        qo = np.concatenate([[0], np.cumsum(row_sz)]).astype(np.int32)
        return int32_like(pages, qo), PagedKV(pages, int32_like(pages, kv_indptr), int32_like(pages, kv_indices),
                                              int32_like(pages, last), layout)
