"""Cascade (multi-level) attention over composable views of one KV cache: no data moved.

Level l groups consecutive query rows (``qo_indptr``) and gives every group one KV view
(a page list in ``kv``): e.g. level 0 a prompt shared by a batch, level 1 each request's
own suffix. Each level runs as a batch prefill whose "requests" are the groups; the
levels' states are merged (softmax by lse, sum states by addition). A key must belong
to exactly one level of a query row.

Each level sees its keys from position 0, so variants whose hooks read positions
(masks, RoPE, ALiBi) are refused: run those on the flat view. The exception is a causal mask
and nothing else positional (the mask analysis finds exactly ``kv_pos <= qo_pos``), as FlashInfer's
cascade applies causal masking to its last level: the levels list a row's keys in order, the
last one holding at least its rows' own tokens, so every key of an earlier level precedes every
query and is shown whole (those levels run the variant without its mask, ``Variant.without_mask``,
a library built with the backend's configuration), while the last level runs the variant itself,
whose mask reads only ``qo_pos - kv_pos``, which the level's own numbering keeps.

``plan`` (once per batch step) checks the levels on the host and makes the backend's plans;
``run`` (per layer) only launches. A level with a single group and a long page list (a prompt
shared by the whole batch) is split along its pages into chunks that run as separate
"requests" of one launch on copies of the query rows (the pages are not moved: the chunks
are consecutive ranges of the same page list), and the chunks' states are merged: split-KV
for the shared prefix, so its keys are read by many CTAs at once instead of by the few that
the batch's query rows alone would make.

A cascade pays fixed costs (a launch per level, the state merges) to read each shared key once.
Where the levels share little (a short prompt, a small batch), one flat attention over each row
group's concatenated page lists is faster: ``plan(mode="auto")`` (the default) runs flat when the
bytes the cascade would save fall below ``CASCADE_MIN_SAVED_BYTES`` per extra level, and the levels
can be concatenated (one cache; per row group, at most one of its page lists ends on a partial page).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attngen.ir import StateAlgebra

from .checks import AttentionArgumentError, as_numpy, check_indptr, check_paged, paged_lengths
from .kv_pool import same_pool
from .module import contiguous, copy_into, int32_like
from .state import merge_state, merge_states, merge_states_sum
from .views import PagedKV, causal_only, require_position_free


@dataclass(frozen=True)
class CascadeLevel:
    qo_indptr: object  # [G+1] int32: query rows of each group of this level
    kv: PagedKV  # one page list per group (kv.indptr has G+1 entries)


@dataclass
class _PlannedLevel:
    kv: PagedKV  # the level's view, or its page chunks (one "request" per chunk)
    qo_indptr: object  # [G+1], or [k+1] = 0, R, 2R, ... for k chunks of a one-group level of R rows
    chunks: int  # 1: run as given; k > 1: q rows replicated k times, states merged
    backend_plan: object  # the backend's prefill (or decode) plan (None on backends without plans)
    decode: bool = False  # run as a decode (a flat view whose row groups are single rows)
    backend: object = None  # what runs the level: None the cascade's backend; else the unmasked variant's


@dataclass
class CascadePlan:
    total_q: int
    levels: list  # [_PlannedLevel]; a flat plan has one level: the concatenated page lists
    mode: str = "cascade"  # "cascade" or "flat": what run executes


CHUNK_KEYS = 2048  # keys per chunk of a split shared level
MAX_CHUNKS = 32
# "auto" runs a cascade only where it saves at least this many K/V bytes per level beyond the first.
# On the H200 (benchmarks/results/cascade_2026-11-29.md) a planned two-level cascade took about 0.07 ms
# more than flat decode where it saved almost nothing (B 16, prefix 1k: 0.151 vs 0.083 ms); 256 MiB is
# about that long at the measured 4.2 TB/s. At B 64, prefix 32k it saves 8.4 GB and ran 3.5x faster.
CASCADE_MIN_SAVED_BYTES = 256 << 20
MODES = ("auto", "cascade", "flat")


def flatten_levels(levels: list[CascadeLevel], qos: list[np.ndarray], ordered: bool = False):
    """The flat view of a cascade (``qos``: each level's qo_indptr on the host): row groups = the union of
    every level's group boundaries, each with the concatenation of its levels' page lists (the one list
    ending on a partial page last; ``ordered``: in level order, where only the last list may end on a partial
    page, for variants that read positions). Returns (PagedKV, qo_indptr [G+1] numpy, flat keys, unique
    keys), or a string saying why the levels cannot be concatenated."""
    ref = levels[0].kv
    for i, lvl in enumerate(levels):
        if not same_pool(lvl.kv.pages, ref.pages) or lvl.kv.layout != ref.layout:
            return f"levels[{i}].kv: a view of another cache (or layout) than levels[0]"
    lists = [(qo, as_numpy(lvl.kv.indptr, f"levels[{i}].kv.indptr"),
              as_numpy(lvl.kv.indices, f"levels[{i}].kv.indices"),
              as_numpy(lvl.kv.last_page_len, f"levels[{i}].kv.last_page_len"))
             for i, (lvl, qo) in enumerate(zip(levels, qos))]
    ps = ref.page_size
    cuts = np.unique(np.concatenate(qos))
    indptr, indices, last = [0], [], []
    unique_keys = sum(int(paged_lengths(np.diff(ip), lp, ps).sum()) for _, ip, _, lp in lists)
    for a, b in zip(cuts[:-1], cuts[1:]):
        full, partial = [], []
        for qo, ip, idx, lp in lists:
            g = int(np.searchsorted(qo, a, side="right")) - 1  # the group of this level holding rows [a, b)
            n = int(ip[g + 1] - ip[g])
            if n:
                (full if lp[g] == ps else partial).append((idx[ip[g]:ip[g + 1]], int(lp[g])))
        if len(partial) > 1:
            return (f"rows {a}..{b - 1}: {len(partial)} of their page lists end on a partial page; only one can "
                    "be concatenated last")
        pieces = full + partial
        if ordered:  # (position order: the lists as the levels give them)
            pieces = [(idx[ip[g]:ip[g + 1]], int(lp[g])) for qo, ip, idx, lp in lists
                      for g in [int(np.searchsorted(qo, a, side="right")) - 1] if ip[g + 1] > ip[g]]
            if any(last_len != ps for _, last_len in pieces[:-1]):
                return (f"rows {a}..{b - 1}: a page list before their last ends on a partial page, which a "
                        "position-reading variant cannot read concatenated")
        indices += [p for pages, _ in pieces for p in pages.tolist()]
        indptr.append(len(indices))
        last.append(pieces[-1][1] if pieces else 0)
    like = ref.indptr
    kv = PagedKV(ref.pages, int32_like(like, np.array(indptr, np.int32)), int32_like(like, np.array(indices, np.int32)),
                 int32_like(like, np.array(last, np.int32)), ref.layout)
    flat_keys = int(paged_lengths(np.diff(indptr), np.array(last), ps).sum())
    return kv, cuts.astype(np.int32), flat_keys, unique_keys


def _split_level(lvl: CascadeLevel, qo: np.ndarray, max_chunks: int, chunk_keys: int) -> tuple[PagedKV, object, int]:
    """Cut a one-group level's page list into up to ``max_chunks`` consecutive page ranges."""
    kv = lvl.kv
    indptr = as_numpy(kv.indptr, "kv.indptr")
    n_pages = int(indptr[1] - indptr[0])
    last = int(as_numpy(kv.last_page_len, "kv.last_page_len")[0])
    keys = int(paged_lengths(n_pages, last, kv.page_size))
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
    def __init__(self, backend, unmasked=None):
        """``backend``: a CPU or CUDA attention library. A causal variant's earlier levels run on ``unmasked``
        (a library of ``backend.variant.without_mask()``), built on first need with the backend's configuration
        when not given."""
        self.backend = backend
        self.variant = backend.variant
        self.causal = causal_only(self.variant)
        if not self.causal:
            require_position_free(backend.variant, "cascade levels")
        if unmasked is not None and (not self.causal or "logits_mask" in unmasked.variant.hooks):
            raise AttentionArgumentError("unmasked: only a causal variant's cascade takes one, a library of "
                                         "backend.variant.without_mask()")
        self._unmasked = unmasked
        # an output transform applies to each level's state before the merge (O, or lse for a hook that reads
        # it, would be transformed once per level): such a variant runs flat, as one attention per row group
        self.flat_only = "output_transform" in self.variant.hooks

    def unmasked(self):
        """The library that runs a causal variant's earlier levels: the one given, else the
        backend's own (``BuiltModule.without_mask``, shared by every view of the backend)."""
        return self._unmasked if self._unmasked is not None else self.backend.without_mask()

    def plan(self, levels: list[CascadeLevel], total_q: int, head_dim: int, *,
             max_chunks: int = MAX_CHUNKS, chunk_keys: int = CHUNK_KEYS, mode: str = "auto",
             num_qo_heads: int | None = None) -> CascadePlan:
        """Host checks of every level and the backend's plans, once per batch step (every layer reuses
        them). A shared one-group level is split into chunks of about ``chunk_keys`` keys, at most
        ``max_chunks`` (1: never split). ``mode``: "cascade" runs the levels and merges their states,
        "flat" one attention over each row group's concatenated page lists, "auto" the cascade only where
        it saves at least CASCADE_MIN_SAVED_BYTES of K/V reads per extra level (``CascadePlan.mode`` says
        which). A flat view whose row groups are single rows (a decode step) runs as a decode where the
        backend has one: on the CUDA backend that needs ``num_qo_heads`` and a library with the decode
        kernel, and a load-balanced plan shares the decode workspace of its shape (a later load-balanced
        ``plan_decode`` of the same shape supersedes it)."""
        if chunk_keys < 1:
            raise AttentionArgumentError(f"chunk_keys: must be at least 1, got {chunk_keys}")
        if mode not in MODES:
            raise AttentionArgumentError(f"mode: one of {MODES}, got {mode!r}")
        qos = _level_qo_indptrs(levels)
        for i, qo in enumerate(qos):
            if qo[-1] != total_q:
                raise AttentionArgumentError(f"levels[{i}].qo_indptr: must cover all {total_q} query rows "
                                             f"(from 0 to {total_q}), got {qo[0]}..{qo[-1]}")
        for i, (lvl, qo) in enumerate(zip(levels, qos)):
            _check_level_view(lvl, i, len(qo) - 1)
        if self.causal:
            self._check_causal_levels(levels, qos)
        if self.flat_only and mode == "cascade":
            raise AttentionArgumentError(f"mode='cascade': variant '{self.variant.name}' has an output transform, "
                                         "which would apply to each level before the merge; use mode='flat' or "
                                         "'auto' (one attention over each group's concatenated pages)")
        if mode != "cascade" and total_q > 0:
            flat = flatten_levels(levels, qos, ordered=self.causal)
            if isinstance(flat, str):
                if mode == "flat" or self.flat_only:
                    raise AttentionArgumentError(
                        f"mode={mode!r}: the levels cannot be concatenated: {flat}; "
                        + (f"variant '{self.variant.name}' has an output transform, which runs flat only"
                           if self.flat_only else "use mode='cascade'"))
            else:
                kv, qo_indptr, flat_keys, unique_keys = flat
                saved = (flat_keys - unique_keys) * _bytes_per_key(kv, head_dim)
                if mode == "flat" or self.flat_only or saved < CASCADE_MIN_SAVED_BYTES * (len(levels) - 1):
                    return CascadePlan(total_q, [self._plan_flat(kv, qo_indptr, head_dim, num_qo_heads)], "flat")
        planned = []
        for i, (lvl, qo) in enumerate(zip(levels, qos)):
            last = i == len(levels) - 1
            runner = self.unmasked() if self.causal and not last else self.backend
            kv, qo_indptr, k = lvl.kv, lvl.qo_indptr, 1
            if len(qo) == 2 and max_chunks > 1 and total_q > 0 and not (self.causal and last):
                kv, qo_indptr, k = _split_level(lvl, qo, max_chunks, chunk_keys)
            backend_plan = None
            if hasattr(runner, "plan_prefill"):
                backend_plan = runner.plan_prefill(qo_indptr, kv, head_dim)
            planned.append(_PlannedLevel(kv, qo_indptr, k, backend_plan,
                                         backend=runner if runner is not self.backend else None))
        return CascadePlan(total_q, planned)

    @staticmethod
    def _check_causal_levels(levels: list[CascadeLevel], qos: list[np.ndarray]) -> None:
        """A causal cascade's levels: each last-level group is one sequence's rows (every earlier level's group
        boundaries are boundaries of the last level: a group spanning two earlier groups would number its rows
        across two sequences), and the last level holds at least each group's query tokens (so that every key
        of an earlier level precedes every query)."""
        i = len(levels) - 1
        for j, qo in enumerate(qos[:-1]):
            inside = np.isin(qo, qos[-1])
            if not inside.all():
                raise AttentionArgumentError(
                    f"levels[{j}].qo_indptr: its boundary {int(qo[np.argmin(inside)])} splits a group of the last "
                    f"level (levels[{i}]); a causal variant's last-level groups must each be one sequence's rows")
        lvl, qo = levels[-1], qos[-1]
        kv = lvl.kv
        keys = paged_lengths(np.diff(as_numpy(kv.indptr, f"levels[{i}].kv.indptr")),
                             as_numpy(kv.last_page_len, f"levels[{i}].kv.last_page_len"), kv.page_size)
        rows = np.diff(qo)
        if len(keys) == len(rows) and np.any(rows > keys):
            g = int(np.argmax(rows > keys))
            raise AttentionArgumentError(
                f"levels[{i}]: group {g} has {int(rows[g])} query rows but {int(keys[g])} keys in the last level; "
                "a causal variant's last level must hold each group's own tokens (the earlier levels' keys "
                "precede every query)")

    def _plan_flat(self, kv: PagedKV, qo_indptr: np.ndarray, head_dim: int, num_qo_heads: int | None):
        qo_dev = int32_like(kv.indptr, qo_indptr)
        if np.all(np.diff(qo_indptr) == 1) and hasattr(self.backend, "decode"):
            if not hasattr(self.backend, "plan_decode"):
                return _PlannedLevel(kv, qo_dev, 1, None, decode=True)
            if num_qo_heads is not None and self.backend.has_decode(kv, head_dim):
                return _PlannedLevel(kv, qo_dev, 1, self.backend.plan_decode(kv, num_qo_heads, head_dim),
                                     decode=True)
        backend_plan = (self.backend.plan_prefill(qo_dev, kv, head_dim) if hasattr(self.backend, "plan_prefill")
                        else None)
        return _PlannedLevel(kv, qo_dev, 1, backend_plan)

    def run(self, q, levels: list[CascadeLevel] | None = None, *, plan: CascadePlan | None = None,
            sm_scale: float | None = None, params: dict | None = None, out=None, lse=None, k_scale=None,
            v_scale=None):
        """q: [total_q, Hq, D]. Returns (out [total_q, Hq, D], lse [total_q, Hq]) over all levels' keys, written
        into ``out`` / ``lse`` where given. Pass ``plan`` (from ``plan``) to skip the per-call host checks, or
        ``levels`` to plan here. ``k_scale``, ``v_scale``: an fp8 cache's scales (as ``decode`` / ``prefill``
        take them), the same for every level."""
        if plan is None:
            if levels is None:
                raise AttentionArgumentError("run: pass the levels or a plan made from them")
            plan = self.plan(levels, int(q.shape[0]), int(q.shape[2]))
        if not isinstance(plan, CascadePlan):
            raise AttentionArgumentError(f"plan: expected a CascadePlan (from CascadeAttention.plan), got "
                                         f"{type(plan).__name__}")
        if plan.total_q != int(q.shape[0]):
            raise AttentionArgumentError(f"plan: made for {plan.total_q} query rows, q has {q.shape[0]}: plan again")
        if out is not None or lse is not None:
            out, lse = self.backend.outputs(q, plan.total_q, out, lse)
        states = []
        scales = self.backend.prepared_scales(q, plan.levels[0].kv, k_scale, v_scale)  # (once, not per level)
        for i, lvl in enumerate(plan.levels):
            qs = q if lvl.chunks == 1 else _repeat_rows(q, lvl.chunks)
            extra = ({"plan": lvl.backend_plan} if lvl.backend_plan is not None else {}) | scales
            if i == 0 and lvl.chunks == 1 and out is not None:  # the first level's state is the merges' target
                extra |= {"out": out, "lse": lse}
            runner = lvl.backend or self.backend
            if lvl.decode:
                o, s = runner.decode(qs, lvl.kv, sm_scale=sm_scale, params=params, **extra)
            else:
                o, s = runner.prefill(qs, lvl.kv, lvl.qo_indptr, sm_scale=sm_scale, params=params, **extra)
            if lvl.chunks > 1:  # [k * R, H, D] chunk states of the same rows -> one state per row
                o, s = _rows_by_chunk(o, lvl.chunks), _rows_by_chunk(s, lvl.chunks)
                if self.variant.state == StateAlgebra.SUM:  # sum states carry no lse: keep one per row
                    o, s = merge_states_sum(o), contiguous(s[:, 0])
                else:
                    o, s = merge_states(o, s)
            states.append((o, s))
        o0, s0 = states[0]
        if self.variant.state == StateAlgebra.SUM and len(states) > 1:
            o0 = merge_states_sum(_stack_like(o0)([o for o, _ in states]))
        elif self.variant.state != StateAlgebra.SUM:
            for o, s in states[1:]:
                merge_state(o0, s0, o, s)
        if out is None:
            return o0, s0
        for dst, src in ((out, o0), (lse, s0)):
            if src is not dst:  # (a first level of chunks, or a sum state's merge: a state of its own)
                copy_into(dst, src)
        return out, lse


def _level_qo_indptrs(levels) -> list[np.ndarray]:
    """Each level's qo_indptr on the host, checked as a batch's qo_indptr is (checks.check_indptr: int32 [G+1],
    from 0, non-decreasing), naming the level: the flat view's row groups are cut from them."""
    if not isinstance(levels, (list, tuple)):
        raise AttentionArgumentError(f"levels: expected a list of CascadeLevel, got {type(levels).__name__}")
    if not levels:
        raise AttentionArgumentError("levels: a cascade needs at least one level")
    for i, lvl in enumerate(levels):
        if not isinstance(lvl, CascadeLevel):
            raise AttentionArgumentError(f"levels[{i}]: expected a CascadeLevel(qo_indptr, kv), got "
                                         f"{type(lvl).__name__}")
    return [check_indptr(lvl.qo_indptr, f"levels[{i}].qo_indptr", None, queries=True) for i, lvl in enumerate(levels)]


def _check_level_view(lvl: CascadeLevel, i: int, groups: int) -> None:
    """Level i's page table: one page list per group of its qo_indptr, page ids inside the cache, last page
    lengths in [1, page_size] (checks.check_paged, its refusals naming the level)."""
    kv = lvl.kv
    if not isinstance(kv, PagedKV):
        raise AttentionArgumentError(f"levels[{i}].kv: expected a PagedKV, got {type(kv).__name__}")
    try:
        dtype = kv.kv_dtype  # (refuses pages that are no 5-dim tensor, by name)
        check_paged(kv, int(kv.pages.shape[-1]), dtype, groups, strided="any")
    except AttentionArgumentError as e:
        raise AttentionArgumentError(f"levels[{i}].{e} (one page list per group of levels[{i}].qo_indptr)") from None


def _bytes_per_key(kv: PagedKV, head_dim: int) -> int:
    """K and V bytes of one key over all KV heads."""
    pages = kv.pages
    elem = pages.element_size() if hasattr(pages, "element_size") else pages.dtype.itemsize
    return 2 * kv.num_kv_heads * head_dim * elem


def _repeat_rows(q, k: int):
    """[R, H, D] -> [k * R, H, D]: the query rows once per chunk."""
    if hasattr(q, "detach"):
        return q.repeat(k, 1, 1)
    return np.ascontiguousarray(np.tile(q, (k, 1, 1)))


def _rows_by_chunk(x, k: int):
    """[k * R, ...] chunk-major -> [R, k, ...] contiguous (the layout merge_states reads)."""
    shape = (k, x.shape[0] // k) + tuple(x.shape[1:])
    if hasattr(x, "detach"):
        return x.reshape(shape).transpose(0, 1).contiguous()
    return contiguous(np.swapaxes(x.reshape(shape), 0, 1))


def _stack_like(ref):
    if hasattr(ref, "detach"):
        import torch

        return lambda xs: torch.stack(xs, 1).contiguous()
    return lambda xs: np.ascontiguousarray(np.stack(xs, 1))
