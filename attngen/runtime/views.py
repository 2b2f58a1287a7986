"""Views of the KV cache passed to attention calls (grouped, never long positional lists)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
