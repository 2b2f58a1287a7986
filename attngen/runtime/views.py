"""Views of the KV cache passed to attention calls (grouped, never long positional lists)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Tensor = Any  # numpy.ndarray or torch.Tensor


@dataclass(frozen=True)
class PagedKV:
    """A paged KV cache and one batch's page table in CSR form."""

    pages: Tensor  # [num_pages, 2, page_size, H_kv, D] (NHD) or [num_pages, 2, H_kv, page_size, D] (HND)
    indptr: Tensor  # [B+1] int32, request b owns indices[indptr[b]:indptr[b+1]]
    indices: Tensor  # [nnz] int32, page ids
    last_page_len: Tensor  # [B] int32, valid slots of each request's last page (1..page_size)
    layout: str = "NHD"

    @property
    def page_size(self) -> int:
        return int(self.pages.shape[2] if self.layout == "NHD" else self.pages.shape[3])

    @property
    def num_kv_heads(self) -> int:
        return int(self.pages.shape[3] if self.layout == "NHD" else self.pages.shape[2])


@dataclass(frozen=True)
class RaggedKV:
    """Keys and values of a batch stored back to back."""

    k: Tensor  # [total_kv, H_kv, D]
    v: Tensor  # [total_kv, H_kv, D]
    indptr: Tensor  # [B+1] int32

    @property
    def num_kv_heads(self) -> int:
        return int(self.k.shape[1])


def require_position_free(variant, view: str) -> None:
    """Views that renumber keys (cascade levels, block-sparse rows) serve only variants whose hooks
    never read a position."""
    from .checks import AttentionArgumentError

    readers = [f"{hook} reads {idx}" for hook, r in variant.analysis.reads.items() for idx in r.indices
               if idx in ("qo_pos", "kv_pos")]
    if readers:
        raise AttentionArgumentError(
            f"variant '{variant.name}': {', '.join(readers)}; {view} number keys from 0 in every view, so "
            "position-dependent variants must use the flat view")


@dataclass(frozen=True)
class BlockSparseView:
    """Block-sparse attention (BSR): query rows in blocks of R, keys in blocks of C.

    The keys live in a paged cache whose pages hold C rows each (page j = key block j), so the
    view is only a page table: block row i reads the key blocks ``indices[indptr[i]:indptr[i+1]]``.
    """

    indptr: Any  # [MB+1] int32, MB = ceil(num_q_rows / R)
    indices: Any  # [nnz] int32 key-block ids, ascending within a block row
    block_rows: int  # R
    num_q_rows: int  # M
    num_kv_rows: int  # N: the last key block may hold fewer than C rows

    def as_paged(self, pages, layout: str = "NHD") -> tuple[Any, PagedKV]:
        """(qo_indptr [MB+1], PagedKV) running the view through the paged prefill kernels."""
        from .checks import AttentionArgumentError, as_numpy

        c = int(pages.shape[2] if layout == "NHD" else pages.shape[3])
        n_blocks = -(-self.num_kv_rows // c)
        indptr = as_numpy(self.indptr, "indptr").astype(np.int32)
        indices = as_numpy(self.indices, "indices").astype(np.int32)
        mb = -(-self.num_q_rows // self.block_rows)
        if len(indptr) != mb + 1:
            raise AttentionArgumentError(f"indptr: has {len(indptr)} entries, expected ceil(M/R) + 1 = {mb + 1}")
        if len(indices) and (indices.min() < 0 or indices.max() >= n_blocks):
            raise AttentionArgumentError(f"indices: key block ids must be in [0, {n_blocks})")
        if int(pages.shape[0]) < n_blocks:
            raise AttentionArgumentError(f"pages: holds {pages.shape[0]} blocks of {c} rows, the view needs {n_blocks}")
        last_rows = self.num_kv_rows - (n_blocks - 1) * c
        last = np.array([(last_rows if indices[e - 1] == n_blocks - 1 else c) if e > s else 0
                         for s, e in zip(indptr[:-1], indptr[1:])], np.int32)
        not_last = [j for s, e in zip(indptr[:-1], indptr[1:]) if e > s for j in indices[s:e - 1]]
        if any(j == n_blocks - 1 for j in not_last):
            raise AttentionArgumentError("indices: the partial last key block must come last in its block row")
        qo = np.minimum(np.arange(mb + 1) * self.block_rows, self.num_q_rows).astype(np.int32)
        from .module import int32_like

        return int32_like(pages, qo), PagedKV(pages, int32_like(pages, indptr), int32_like(pages, indices),
                                              int32_like(pages, last), layout)

