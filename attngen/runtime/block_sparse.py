"""Block-sparse attention with one BSR layout per KV head, run through the paged prefill templates.

``HeadwiseBlockSparseView`` gives every KV head h its own layout: block row i of head h covers
``block_row_sz[h][i]`` query rows and reads the key blocks ``indices[h][indptr[h][i]:indptr[h][i+1]]``,
key block j holding ``block_col_sz[h][j]`` key rows. Build it with ``uniform`` (fixed R x C blocks, as
FlashInfer's BlockSparseAttentionWrapper, with per-head indptr / indices) or ``from_block_mask``
(FlashInfer's VariableBlockSparseAttentionWrapper: block_mask_map, block_row_sz, block_col_sz).

``BlockSparseAttention`` runs such a view, or a shared-layout ``BlockSparseView``, on the CPU or the
CUDA backend. A headwise view costs one paged prefill per KV head: head h's query group and its keys
are copied out contiguous (the backends take contiguous tensors only) and its block rows become the
call's requests; the outputs are scattered back. Head h's keys are paged in pages of
gcd(its key-block sizes but the last), so every block is a run of whole pages (the last may end
partway); a cache already paged that way is only sliced per head.

Each call numbers its keys, block rows and heads from 0, so variants whose hooks read a position or a
head index are refused; except a causal mask and nothing else positional (FlashInfer's block-sparse
``causal``), with square blocks on the diagonal (block row i as large as key block i): blocks after the
diagonal are dropped (``causal_blocks``); a row reading its diagonal block runs on the variant (its last query
row meets its last key as the causal mask wants, every earlier block seen whole), and a row reading only
blocks before its diagonal, all of whose keys are visible, runs on the variant without its mask (a sibling
library, ``BuiltModule.sibling``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attngen.ir.declarations import INT_RANGES
from attngen.ir.hook_spec import HEADS

from .checks import AttentionArgumentError, as_numpy, check_integers, check_layout, dtype_name
from .kv_pool import as_pool
from .module import contiguous, empty_like, int32_like, scale_kwargs
from .views import (BlockSparseView, PagedKV, bsr_page_table, causal_blocks, causal_only, check_bsr, hook_readers,
                    require_position_free)


INT32_MAX = INT_RANGES["int32"][1]


def _head_scales(scales: dict, h: int, num_kv_heads: int) -> dict:
    """KV head h's k_scale / v_scale for its own one-head call: a float or one-entry scale as given, head h's
    entry of one per KV head; any other count is refused here, in the view's terms."""
    out = {}
    for name, scale in scales.items():
        n = int(np.prod(scale.shape)) if hasattr(scale, "shape") else 1
        if len(getattr(scale, "shape", ())) > 1 or n not in (1, num_kv_heads):
            raise AttentionArgumentError(f"{name}: shape {tuple(scale.shape)} for {num_kv_heads} KV heads; pass a "
                                         f"float or a float32 tensor of [1] or [num_kv_heads={num_kv_heads}]")
        out[name] = scale.reshape(-1)[h:h + 1] if n > 1 else scale
    return out


def _host(x, name: str) -> np.ndarray:
    """A host NumPy copy or view of an array, CPU / CUDA tensor or nested list."""
    return np.asarray(as_numpy(x, name) if hasattr(x, "detach") else x)


def _per_head(x, name: str) -> list:
    """One 1-D array per KV head, from a list of arrays or a 2-D array [Hkv, ...]."""
    heads = list(x) if isinstance(x, (list, tuple)) or getattr(x, "ndim", 0) == 2 else None
    if heads is None:
        raise AttentionArgumentError(f"{name}: expected one 1-D array per KV head (a list, or a 2-D array "
                                     f"[num_kv_heads, ...]), got {type(x).__name__} of shape "
                                     f"{tuple(getattr(x, 'shape', ()))}")
    out = []
    for h, a in enumerate(heads):
        a = _host(a, f"{name}[{h}]")
        if a.ndim != 1:
            raise AttentionArgumentError(f"{name}[{h}]: expected a 1-D array, got shape {a.shape}")
        check_integers(a, f"{name}[{h}]")
        out.append(a)
    return out


def _block_sizes(n_rows: int, block: int, name: str) -> np.ndarray:
    """Sizes of ceil(n_rows / block) blocks of ``block`` rows, the last partial: [ceil(n_rows / block)]."""
    if int(block) != block or block < 1:
        raise AttentionArgumentError(f"{name}: must be a positive int, got {block!r}")
    return np.minimum(block, n_rows - np.arange(-(-n_rows // block)) * block).astype(np.int32)


@dataclass(frozen=True, eq=False)
class HeadwiseBlockSparseView:
    """Block-sparse attention (BSR) with one layout and one set of block sizes per KV head.

    Every field holds one host int32 array per KV head (checked and normalised on construction).
    Blocks may vary in size, but every head's row blocks tile the same M query rows and its key
    blocks the same N key rows.
    """

    indptr: tuple  # Hkv arrays; indptr[h]: [MB_h+1] int32
    indices: tuple  # Hkv arrays; indices[h]: [nnz_h] int32 key-block ids, strictly ascending within a block row
    block_row_sz: tuple  # Hkv arrays; block_row_sz[h]: [MB_h] int32 query rows of each block row, summing to M
    block_col_sz: tuple  # Hkv arrays; block_col_sz[h]: [NB_h] int32 key rows of each key block, summing to N

    def __post_init__(self):
        fields = {name: _per_head(getattr(self, name), name)
                  for name in ("indptr", "indices", "block_row_sz", "block_col_sz")}
        counts = {name: len(a) for name, a in fields.items()}
        if len(set(counts.values())) != 1 or counts["indptr"] == 0:
            raise AttentionArgumentError(f"per-head arrays: counts {counts} differ or are 0; give one array per KV "
                                         "head in each of indptr, indices, block_row_sz, block_col_sz")
        indptr, indices = [], []
        for h in range(counts["indptr"]):
            row_sz, col_sz = fields["block_row_sz"][h], fields["block_col_sz"][h]
            for name, sz in (("block_row_sz", row_sz), ("block_col_sz", col_sz)):
                if len(sz) and sz.min() < 1:
                    raise AttentionArgumentError(f"{name}[{h}]: block sizes must be >= 1, got {int(sz.min())}")
                if len(sz) and sz.max() > INT32_MAX:
                    raise AttentionArgumentError(f"{name}[{h}]: block sizes must fit int32 (at most {INT32_MAX}), got "
                                                 f"{int(sz.max())}")
                if sz.sum() != fields[name][0].sum():
                    what = "query" if name == "block_row_sz" else "key"
                    raise AttentionArgumentError(
                        f"{name}[{h}]: its blocks cover {int(sz.sum())} {what} rows but {name}[0]'s cover "
                        f"{int(fields[name][0].sum())}; every head's blocks must tile the same {what} rows")
            if len(fields["indptr"][h]) != len(row_sz) + 1:
                raise AttentionArgumentError(
                    f"indptr[{h}]: has {len(fields['indptr'][h])} entries but block_row_sz[{h}] has {len(row_sz)} "
                    f"block rows; give block_row_sz[{h}] one size per block row ({len(row_sz) + 1} indptr entries)")
            ip, ix = check_bsr(fields["indptr"][h], fields["indices"][h], len(col_sz), f"[{h}]")
            indptr.append(ip)
            indices.append(ix)
        object.__setattr__(self, "indptr", tuple(indptr))
        object.__setattr__(self, "indices", tuple(indices))
        for name in ("block_row_sz", "block_col_sz"):
            object.__setattr__(self, name, tuple(a.astype(np.int32) for a in fields[name]))

    @classmethod
    def uniform(cls, indptr, indices, block_rows: int, block_cols: int, num_q_rows: int,
                num_kv_rows: int) -> "HeadwiseBlockSparseView":
        """Fixed R x C blocks, one BSR layout per KV head; the last block row / key block may be partial.

        indptr: Hkv arrays [ceil(M/R)+1] (or a 2-D array); indices: Hkv arrays [nnz_h] of ids in [0, ceil(N/C)).
        """
        row_sz = _block_sizes(num_q_rows, block_rows, "block_rows")
        col_sz = _block_sizes(num_kv_rows, block_cols, "block_cols")
        heads = _per_head(indptr, "indptr")
        for h, ip in enumerate(heads):
            if len(ip) != len(row_sz) + 1:
                raise AttentionArgumentError(f"indptr[{h}]: has {len(ip)} entries, expected ceil(M/R) + 1 = "
                                             f"{len(row_sz) + 1} (M={num_q_rows}, R={block_rows})")
        return cls(tuple(heads), indices, (row_sz,) * len(heads), (col_sz,) * len(heads))

    @classmethod
    def from_block_mask(cls, block_mask_map, block_row_sz, block_col_sz) -> "HeadwiseBlockSparseView":
        """FlashInfer's variable block-sparse form. block_mask_map: [Hkv, MB, NB] bool, True where block row i of
        head h reads key block j; block_row_sz: [Hkv, MB] query rows per block row; block_col_sz: [Hkv, NB]
        key rows per key block."""
        mask = _host(block_mask_map, "block_mask_map")
        if mask.ndim != 3:
            raise AttentionArgumentError(f"block_mask_map: expected [num_kv_heads, MB, NB], got shape {mask.shape}")
        mask = mask.astype(bool)
        sizes = {}
        for name, sz, want in (("block_row_sz", block_row_sz, mask.shape[:2]),
                               ("block_col_sz", block_col_sz, (mask.shape[0], mask.shape[2]))):
            a = _host(sz, name)
            if a.shape != want:
                raise AttentionArgumentError(f"{name}: shape {a.shape}, expected {want} to match block_mask_map "
                                             f"{mask.shape} = [num_kv_heads, MB, NB]")
            sizes[name] = tuple(a)
        indptr = tuple(np.concatenate([[0], np.cumsum(m.sum(1))]).astype(np.int32) for m in mask)
        indices = tuple(np.nonzero(m)[1].astype(np.int32) for m in mask)  # row-major: ascending per row
        return cls(indptr, indices, sizes["block_row_sz"], sizes["block_col_sz"])

    @property
    def num_kv_heads(self) -> int:
        return len(self.indptr)

    @property
    def num_q_rows(self) -> int:
        return int(self.block_row_sz[0].sum())

    @property
    def num_kv_rows(self) -> int:
        return int(self.block_col_sz[0].sum())

    def head_page_size(self, h: int, stored_page_size: int) -> int:
        """Page size of head h's call: the cache's own where every key block starts on one of its pages
        (no repacking), else the gcd of the head's key-block sizes but the last."""
        sz = self.block_col_sz[h]
        whole = int(np.gcd.reduce(sz[:-1])) if len(sz) > 1 else int(sz[0])
        return stored_page_size if whole % stored_page_size == 0 else whole


def _head_pages(pages, layout: str, h: int, page_size: int, n_pages: int, n_rows: int):
    """Head h's keys and values as a contiguous one-head cache of ``n_pages`` pages of ``page_size`` rows:
    [n_pages, 2, page_size, 1, D] (NHD) or [n_pages, 2, 1, page_size, D] (HND).

    pages: [num_pages, 2, S, Hkv, D] (NHD) or [num_pages, 2, Hkv, S, D] (HND), keys 0..n_rows-1 in page order.
    """
    kv = pages[:, :, :, h] if layout == "NHD" else pages[:, :, h]  # [num_pages, 2, S, D]
    d = int(kv.shape[3])
    if int(kv.shape[2]) == page_size:
        one = contiguous(kv[:n_pages])
    else:
        stored = -(-n_rows // int(kv.shape[2]))  # (the pages holding the keys: the rest of the pool is not copied)
        rows = kv[:stored].swapaxes(0, 1).reshape(2, -1, d)[:, :n_rows]  # [2, n_rows, D]
        buf = empty_like(pages, (2, n_pages * page_size, d), dtype_name(pages))
        buf[:, :n_rows] = rows
        buf[:, n_rows:] = 0  # past last_page_len: never used, but no stray NaN from fresh memory
        one = contiguous(buf.reshape(2, n_pages, page_size, d).swapaxes(0, 1))
    shape = (n_pages, 2, page_size, 1, d) if layout == "NHD" else (n_pages, 2, 1, page_size, d)
    return one.reshape(shape)


def _causal_shared(view: BlockSparseView, pages, layout: str):
    """A shared-layout view under a causal mask (views.causal_blocks; R x C blocks, C the pages' rows): its
    aligned view, its wholly visible view, and the query rows [M] bool of the second."""
    indptr, indices, row_sz, col_sz = view.blocks(pages, layout)
    aligned, whole, whole_rows = causal_blocks(indptr, indices, row_sz, col_sz)
    views = [BlockSparseView(*bsr, view.block_rows, view.num_q_rows, view.num_kv_rows) for bsr in (aligned, whole)]
    return views[0], views[1], np.repeat(whole_rows, row_sz)


def _causal_headwise(view):
    """A headwise view under a causal mask (views.causal_blocks per head): its aligned view, its wholly visible
    view, and the query rows [Hkv, M] bool of the second."""
    parts = [causal_blocks(view.indptr[h], view.indices[h], view.block_row_sz[h], view.block_col_sz[h], f"[{h}]")
             for h in range(view.num_kv_heads)]
    views = [HeadwiseBlockSparseView([p[k][0] for p in parts], [p[k][1] for p in parts], view.block_row_sz,
                                     view.block_col_sz) for k in (0, 1)]
    rows = np.stack([np.repeat(p[2], view.block_row_sz[h]) for h, p in enumerate(parts)])
    return views[0], views[1], rows


def _take_rows(out, lse, o_w, lse_w, rows: np.ndarray, heads: slice) -> None:
    """out / lse [M, Hq, ...] take the query rows ``rows`` [M] bool of query heads ``heads`` from o_w / lse_w."""
    if not rows.any():
        return
    if hasattr(out, "detach"):
        import torch

        rows = torch.as_tensor(rows, device=out.device)
    out[:, heads][rows] = o_w[:, heads][rows]
    lse[:, heads][rows] = lse_w[:, heads][rows]


class BlockSparseAttention:
    """Block-sparse views run through a backend's (``CPUAttention`` / ``CUDAAttention``) paged prefill."""

    def __init__(self, backend, unmasked=None):
        """``unmasked``: for a causal variant, a library of ``backend.variant.without_mask()`` serving the rows
        that read blocks before their diagonal but not it (built with the backend's configuration on first need
        when not given)."""
        self.causal = causal_only(backend.variant)
        if not self.causal:
            require_position_free(backend.variant, "block-sparse rows")
        self.backend = backend
        self.variant = backend.variant
        self._unmasked = unmasked

    def unmasked(self):
        """The library of the variant without its mask (causal variants): the one given, else the
        backend's own (``BuiltModule.without_mask``, shared by every view of the backend)."""
        return self._unmasked if self._unmasked is not None else self.backend.without_mask()

    def run(self, q, pages, view: BlockSparseView | HeadwiseBlockSparseView, *, layout: str = "NHD",
            sm_scale: float | None = None, params: dict | None = None, out=None, lse=None, k_scale=None,
            v_scale=None):
        """q: [M, Hq, D]; pages: [num_pages, 2, S, Hkv, D] (NHD) or [num_pages, 2, Hkv, S, D] (HND) holding
        keys 0..N-1 in page order (S = C for a ``BlockSparseView``; a headwise view takes any S, e.g. dense
        k, v [N, Hkv, D] as one page: ``stack((k, v), 1)[None]``).
        Returns (out [M, Hq, D], lse [M, Hq] base 2); rows that read no block get O = 0, lse = -inf.
        ``k_scale``, ``v_scale``: an fp8 cache's scales (a float, or one per KV head), as ``prefill`` takes them."""
        scales = scale_kwargs(k_scale, v_scale)
        check_layout(layout)
        pages = as_pool(pages, layout)  # (FlashInfer's (k_pages, v_pages) form: kv_pool.py)
        if isinstance(view, BlockSparseView):
            if not self.causal:
                return self._run_shared(self.backend, q, pages, view, layout, sm_scale, params, out, lse, scales)
            aligned, whole, whole_rows = _causal_shared(view, pages, layout)
            out, lse = self._run_shared(self.backend, q, pages, aligned, layout, sm_scale, params, out, lse, scales)
            if whole_rows.any():
                o_w, lse_w = self._run_shared(self.unmasked(), q, pages, whole, layout, sm_scale, params, None, None,
                                              scales)
                _take_rows(out, lse, o_w, lse_w, whole_rows, slice(None))
            return out, lse
        if not isinstance(view, HeadwiseBlockSparseView):
            raise AttentionArgumentError(f"view: expected a BlockSparseView or HeadwiseBlockSparseView, got "
                                         f"{type(view).__name__}")
        readers = hook_readers(self.variant, HEADS)
        if readers:
            raise AttentionArgumentError(
                f"variant '{self.variant.name}': {', '.join(readers)}; a headwise view runs one call per KV head "
                "that numbers heads from 0, so run head-dependent variants on a shared-layout BlockSparseView")
        n_kv, s = self._check(q, pages, view, layout)
        if not self.causal:
            return self._run_headwise(self.backend, q, pages, view, layout, s, sm_scale, params, out, lse, scales)
        aligned, whole, whole_rows = _causal_headwise(view)
        out, lse = self._run_headwise(self.backend, q, pages, aligned, layout, s, sm_scale, params, out, lse, scales)
        if whole_rows.any():
            o_w, lse_w = self._run_headwise(self.unmasked(), q, pages, whole, layout, s, sm_scale, params, None, None,
                                            scales)
            group = int(q.shape[1]) // n_kv
            for h in range(n_kv):
                _take_rows(out, lse, o_w, lse_w, whole_rows[h], slice(h * group, (h + 1) * group))
        return out, lse

    @staticmethod
    def _run_shared(backend, q, pages, view: BlockSparseView, layout: str, sm_scale, params, out, lse, scales):
        if len(getattr(q, "shape", ())) != 3 or int(q.shape[0]) != view.num_q_rows:
            raise AttentionArgumentError(f"q: shape {tuple(getattr(q, 'shape', ()))}, expected [M, Hq, D] with M = "
                                         f"{view.num_q_rows} (the view's num_q_rows)")
        qo_indptr, kv = view.as_paged(pages, layout)
        return backend.prefill(q, kv, qo_indptr, sm_scale=sm_scale, params=params, out=out, lse=lse, **scales)

    def _run_headwise(self, backend, q, pages, view: HeadwiseBlockSparseView, layout: str, s: int, sm_scale, params,
                      out, lse, scales):
        """One paged prefill of ``backend`` per KV head (its query group and its keys, with its scales), scattered
        into out / lse."""
        n_kv = view.num_kv_heads
        m, group = view.num_q_rows, int(q.shape[1]) // n_kv
        out, lse = backend.outputs(q, m, out, lse)
        if m == 0:
            return out, lse
        for h in range(n_kv):
            qo_indptr = np.concatenate([[0], np.cumsum(view.block_row_sz[h])])
            heads = slice(h * group, (h + 1) * group)
            o_h, lse_h = backend.prefill(contiguous(q[:, heads]), self._head_kv(pages, layout, view, h, s),
                                         int32_like(q, qo_indptr), sm_scale=sm_scale, params=params,
                                         **_head_scales(scales, h, n_kv))
            out[:, heads] = o_h
            lse[:, heads] = lse_h
        return out, lse

    @staticmethod
    def _check(q, pages, view: HeadwiseBlockSparseView, layout: str) -> tuple[int, int]:
        """(Hkv, stored page size S) after the checks the per-head calls cannot word in the view's terms."""
        if layout not in ("NHD", "HND"):
            raise AttentionArgumentError(f"layout: {layout!r} is not 'NHD' or 'HND'")
        if len(getattr(pages, "shape", ())) != 5 or pages.shape[1] != 2:
            raise AttentionArgumentError(f"pages: shape {tuple(getattr(pages, 'shape', ()))} is not "
                                         f"[num_pages, 2, ...] with 5 dims ({layout})")
        n_kv, s = (int(pages.shape[3]), int(pages.shape[2])) if layout == "NHD" else (int(pages.shape[2]),
                                                                                     int(pages.shape[3]))
        if n_kv != view.num_kv_heads:
            raise AttentionArgumentError(f"pages: holds {n_kv} KV heads but the view has layouts for "
                                         f"{view.num_kv_heads}; give one BSR layout per KV head")
        if int(pages.shape[0]) * s < view.num_kv_rows:
            raise AttentionArgumentError(f"pages: holds {int(pages.shape[0]) * s} key rows ({pages.shape[0]} pages "
                                         f"of {s}), the view's key blocks cover {view.num_kv_rows}")
        if len(getattr(q, "shape", ())) != 3 or int(q.shape[0]) != view.num_q_rows:
            raise AttentionArgumentError(f"q: shape {tuple(getattr(q, 'shape', ()))}, expected [M, Hq, D] with "
                                         f"M = {view.num_q_rows}, the query rows the view's block rows cover")
        if int(q.shape[1]) % n_kv:
            raise AttentionArgumentError(f"q: {q.shape[1]} heads is not a multiple of the {n_kv} KV heads (GQA)")
        return n_kv, s

    @staticmethod
    def _head_kv(pages, layout: str, view: HeadwiseBlockSparseView, h: int, stored_page_size: int) -> PagedKV:
        """Head h's BSR layout as a page table over a contiguous copy of its keys."""
        if len(view.indices[h]) == 0:  # no block: one zero page and a spare id keep every array non-empty
            d = int(pages.shape[4])
            zero = empty_like(pages, (1, 2, 1, 1, d), dtype_name(pages))
            zero[...] = 0
            rows = len(view.indptr[h]) - 1
            return PagedKV(zero, int32_like(pages, np.zeros(rows + 1)), int32_like(pages, [0]),
                           int32_like(pages, np.zeros(rows)), layout)
        p = view.head_page_size(h, stored_page_size)
        kv_indptr, kv_indices, last = bsr_page_table(view.indptr[h], view.indices[h], view.block_col_sz[h], p)
        n_rows = view.num_kv_rows
        head = _head_pages(pages, layout, h, p, -(-n_rows // p), n_rows)
        return PagedKV(head, int32_like(pages, kv_indptr), int32_like(pages, kv_indices), int32_like(pages, last),
                       layout)
