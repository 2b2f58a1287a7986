"""Cascade (multi-level) attention over composable views of one KV cache: no data moved.

Level l groups consecutive query rows (``qo_indptr``) and gives every group one KV view
(a page list in ``kv``): e.g. level 0 a prompt shared by a batch, level 1 each request's
own suffix. Each level runs as a batch prefill whose "requests" are the groups; the
levels' states are merged (softmax by lse, sum states by addition). A key must belong
to exactly one level of a query row.

Each level sees its keys from position 0, so variants whose hooks read positions
(masks, RoPE, ALiBi) are refused: run those on the flat view.

``plan`` (once per batch step) checks the levels on the host and makes the backend's plans;
``run`` (per layer) only launches. A level with a single group and a long page list (a prompt
shared by the whole batch) is split along its pages into chunks that run as separate
"requests" of one launch on copies of the query rows (the pages are not moved: the chunks
are consecutive ranges of the same page list), and the chunks' states are merged: split-KV
for the shared prefix, so its keys are read by many CTAs at once instead of by the few that
the batch's query rows alone would make.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attngen.ir import StateAlgebra

from .checks import AttentionArgumentError, as_numpy
from .module import int32_like
from .state import merge_state, merge_states, merge_states_sum
from .views import PagedKV, require_position_free


@dataclass(frozen=True)
class CascadeLevel:
    qo_indptr: object  # [G+1] int32: query rows of each group of this level
    kv: PagedKV  # one page list per group (kv.indptr has G+1 entries)


@dataclass
class _PlannedLevel:
    kv: PagedKV  # the level's view, or its page chunks (one "request" per chunk)
    qo_indptr: object  # [G+1], or [k+1] = 0, R, 2R, ... for k chunks of a one-group level of R rows
    chunks: int  # 1: run as given; k > 1: q rows replicated k times, states merged
    backend_plan: object  # the backend's prefill plan (None on backends without one)


@dataclass
class CascadePlan:
    total_q: int
    levels: list


CHUNK_KEYS = 2048  # keys per chunk of a split shared level
MAX_CHUNKS = 32


def _split_level(lvl: CascadeLevel, qo: np.ndarray, max_chunks: int, chunk_keys: int) -> tuple[PagedKV, object, int]:
    """Cut a one-group level's page list into up to ``max_chunks`` consecutive page ranges."""
    kv = lvl.kv
    indptr = as_numpy(kv.indptr, "kv.indptr")
    n_pages = int(indptr[1] - indptr[0])
    last = int(as_numpy(kv.last_page_len, "kv.last_page_len")[0])
    keys = (n_pages - 1) * kv.page_size + last if n_pages else 0
    k = min(max_chunks, n_pages, -(-keys // chunk_keys)) if keys else 1
    if k <= 1:
        return kv, lvl.qo_indptr, 1
    bounds = np.linspace(indptr[0], indptr[1], k + 1).round().astype(np.int32)
    last_lens = np.full(k, kv.page_size, np.int32)
    last_lens[-1] = last
    rows = int(qo[1])
    chunks = PagedKV(kv.pages, int32_like(kv.indptr, bounds), kv.indices, int32_like(kv.indptr, last_lens),
                     kv.layout)
    return chunks, int32_like(kv.indptr, np.arange(k + 1) * rows), k


class CascadeAttention:
    def __init__(self, backend):
        require_position_free(backend.variant, "cascade levels")
        self.backend = backend
        self.variant = backend.variant

    def plan(self, levels: list[CascadeLevel], total_q: int, head_dim: int, *,
             max_chunks: int = MAX_CHUNKS, chunk_keys: int = CHUNK_KEYS) -> CascadePlan:
        """Host checks of every level and the backend's plans, once per batch step (every layer reuses
        them). A shared one-group level is split into chunks of about ``chunk_keys`` keys, at most
        ``max_chunks`` (1: never split)."""
        if chunk_keys < 1:
            raise AttentionArgumentError(f"chunk_keys: must be at least 1, got {chunk_keys}")
        if not levels:
            raise AttentionArgumentError("levels: a cascade needs at least one level")
        planned = []
        for i, lvl in enumerate(levels):
            qo = as_numpy(lvl.qo_indptr, f"levels[{i}].qo_indptr")
            if qo[0] != 0 or qo[-1] != total_q:
                raise AttentionArgumentError(f"levels[{i}].qo_indptr: must cover all {total_q} query rows "
                                             f"(from 0 to {total_q}), got {qo[0]}..{qo[-1]}")
            kv, qo_indptr, k = lvl.kv, lvl.qo_indptr, 1
            if len(qo) == 2 and max_chunks > 1 and total_q > 0:
                kv, qo_indptr, k = _split_level(lvl, qo, max_chunks, chunk_keys)
            backend_plan = None
            if hasattr(self.backend, "plan_prefill"):
                backend_plan = self.backend.plan_prefill(qo_indptr, kv, head_dim)
            planned.append(_PlannedLevel(kv, qo_indptr, k, backend_plan))
        return CascadePlan(total_q, planned)

    def run(self, q, levels: list[CascadeLevel] | None = None, *, plan: CascadePlan | None = None,
            sm_scale: float | None = None, params: dict | None = None):
        """q: [total_q, Hq, D]. Returns (out [total_q, Hq, D], lse [total_q, Hq]) over all levels' keys.
        Pass ``plan`` (from ``plan``) to skip the per-call host checks, or ``levels`` to plan here."""
        if plan is None:
            if levels is None:
                raise AttentionArgumentError("run: pass the levels or a plan made from them")
            plan = self.plan(levels, int(q.shape[0]), int(q.shape[2]))
        if plan.total_q != int(q.shape[0]):
            raise AttentionArgumentError(f"plan: made for {plan.total_q} query rows, q has {q.shape[0]}: plan again")
        states = []
        for lvl in plan.levels:
            qs = q if lvl.chunks == 1 else _repeat_rows(q, lvl.chunks)
            extra = {"plan": lvl.backend_plan} if lvl.backend_plan is not None else {}
            o, s = self.backend.prefill(qs, lvl.kv, lvl.qo_indptr, sm_scale=sm_scale, params=params, **extra)
            if lvl.chunks > 1:  # [k * R, H, D] chunk states of the same rows -> one state per row
                o, s = _rows_by_chunk(o, lvl.chunks), _rows_by_chunk(s, lvl.chunks)
                if self.variant.state == StateAlgebra.SUM:  # sum states carry no lse: keep one per row
                    o, s = merge_states_sum(o), _contiguous(s[:, 0])
                else:
                    o, s = merge_states(o, s)
            states.append((o, s))
        out, lse = states[0]
        if self.variant.state == StateAlgebra.SUM:
            if len(states) == 1:
                return out, lse
            return merge_states_sum(_stack_like(out)([o for o, _ in states])), lse
        for o, s in states[1:]:
            merge_state(out, lse, o, s)
        return out, lse


def _repeat_rows(q, k: int):
    """[R, H, D] -> [k * R, H, D]: the query rows once per chunk."""
    if hasattr(q, "detach"):
        return q.repeat(k, 1, 1)
    return np.ascontiguousarray(np.tile(q, (k, 1, 1)))


def _contiguous(x):
    return x.contiguous() if hasattr(x, "detach") else np.ascontiguousarray(x)


def _rows_by_chunk(x, k: int):
    """[k * R, ...] chunk-major -> [R, k, ...] contiguous (the layout merge_states reads)."""
    shape = (k, x.shape[0] // k) + tuple(x.shape[1:])
    if hasattr(x, "detach"):
        return x.reshape(shape).transpose(0, 1).contiguous()
    return _contiguous(np.swapaxes(x.reshape(shape), 0, 1))


def _stack_like(ref):
    if hasattr(ref, "detach"):
        import torch

        return lambda xs: torch.stack(xs, 1).contiguous()
    return lambda xs: np.ascontiguousarray(np.stack(xs, 1))
