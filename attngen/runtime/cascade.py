"""Cascade (multi-level) attention over composable views of one KV cache: no data moved.

Level l groups consecutive query rows (``qo_indptr``) and gives every group one KV view
(a page list in ``kv``): e.g. level 0 a prompt shared by a batch, level 1 each request's
own suffix. Each level runs as a batch prefill whose "requests" are the groups; the
levels' states are merged (softmax by lse, sum states by addition). A key must belong
to exactly one level of a query row.

Each level sees its keys from position 0, so variants whose hooks read positions
(masks, RoPE, ALiBi) are refused: run those on the flat view.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attngen.ir import StateAlgebra

from .checks import AttentionArgumentError, as_numpy
from .state import merge_state, merge_states_sum
from .views import PagedKV, require_position_free


@dataclass(frozen=True)
class CascadeLevel:
    qo_indptr: object  # [G+1] int32: query rows of each group of this level
    kv: PagedKV  # one page list per group (kv.indptr has G+1 entries)


class CascadeAttention:
    def __init__(self, backend):
        require_position_free(backend.variant, "cascade levels")
        self.backend = backend
        self.variant = backend.variant

    def run(self, q, levels: list[CascadeLevel], *, sm_scale: float | None = None, params: dict | None = None):
        """q: [total_q, Hq, D]. Returns (out [total_q, Hq, D], lse [total_q, Hq]) over all levels' keys."""
        if not levels:
            raise AttentionArgumentError("levels: a cascade needs at least one level")
        for i, lvl in enumerate(levels):
            qo = as_numpy(lvl.qo_indptr, f"levels[{i}].qo_indptr")
            if qo[0] != 0 or qo[-1] != q.shape[0]:
                raise AttentionArgumentError(f"levels[{i}].qo_indptr: must cover all {q.shape[0]} query rows "
                                             f"(from 0 to {q.shape[0]}), got {qo[0]}..{qo[-1]}")
        states = [self.backend.prefill(q, lvl.kv, lvl.qo_indptr, sm_scale=sm_scale, params=params)
                  for lvl in levels]
        out, lse = states[0]
        if self.variant.state == StateAlgebra.SUM:
            return merge_states_sum(_stack_like(out)([o for o, _ in states])), lse
        for o, s in states[1:]:
            merge_state(out, lse, o, s)
        return out, lse


def _stack_like(ref):
    if hasattr(ref, "detach"):
        import torch

        return lambda xs: torch.stack(xs, 1).contiguous()
    return lambda xs: np.ascontiguousarray(np.stack(xs, 1))
