"""The fuzzer's view kinds: the views that build on the prefill, drawn, spoilt and checked as cases of their own.

``make_case(..., kinds=VIEW_KINDS)`` draws "cascade" (random levels of row groups over one cache, nested or, for a
variant without positions, not; modes, chunked shared levels, causal variants), "bsr" (block-sparse layouts:
shared, per KV head with fixed or variable blocks, causal with square diagonal blocks) and "append"
(``append_paged_kv`` into a grown view, then a prefill or decode read of it). Their oracle is the same float64
reference over the keys each query row sees, worked out here from what was drawn (a cascade: every level's keys of
the row, concatenated; a block-sparse view: its dense mask), and ``VIEW_FAULTS`` spoil them in ways each view's
checks must refuse by name (``apply_view_fault``; a refused append must write nothing). A view that renumbers keys
(or heads) must refuse a variant whose hooks read them (``_view_refuses``).

Built on tests/fuzz_engine.py (recipes, cases, the base kinds, the oracle's comparison, KNOWN_GAPS), which does
not import this module: ``make_case`` and ``run_case`` here take every kind, base kinds going to the engine's
(drawn exactly as ``fuzz_engine.make_case`` draws them). Used by tests/test_fuzz_cpu.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from attngen import Variant
from attngen.runtime import (BlockSparseAttention, BlockSparseView, CascadeAttention, CascadeLevel,
                             HeadwiseBlockSparseView, PagedKV, RaggedKV, append_paged_kv)
from attngen.runtime.reference import reference_attention

from .fuzz_engine import (_RECIPES, ATTNGEN_ERRORS, BASE_KINDS, HEAD_DIM, Case, FuzzFailure, Recipe, _batch_lens,
                          _compare, _pages_of, _params, _poison, _rows_reference, _slot_copies, stored_pages,
                          _with_defaults, _write_slots, draw_kind, guarded, make_base_case, pool_in_form)
from .fuzz_engine import run_case as run_base_case

VIEW_KINDS = ("cascade", "bsr", "append")

SKIP = "skip"  # a view fault's answer where it does not apply to the case


# ---- every kind -------------------------------------------------------------------------------------------
def make_case(variant: Variant, seed: int, head_dim: int = HEAD_DIM, kinds: tuple = BASE_KINDS) -> Case:
    """``fuzz_engine.make_case`` over base and view kinds: a random batch for ``variant`` from ``seed`` of one of
    ``kinds`` (the same draws as the engine's for a base kind)."""
    rng, kind = draw_kind(seed, kinds)
    if kind in VIEW_KINDS:
        return _VIEW_MAKERS[kind](variant, rng, head_dim)
    return make_base_case(variant, kind, rng, head_dim)


def run_case(variant: Variant, att, case: Case, fault: str, rng) -> str:
    """``fuzz_engine.run_case`` over base and view kinds (a view kind's ``fault`` one of ``VIEW_FAULTS[kind]``):
    "ok", "skip", "refused:<Error>" or "gap:<fault or path>" (KNOWN_GAPS); raises FuzzFailure."""
    if case.kind not in VIEW_KINDS:
        return run_base_case(variant, att, case, fault, rng)
    call = apply_view_fault(variant, case, fault, rng)
    if call is None:
        return "skip"
    what = f"{variant.name} {case.kind} fault={fault} injected=({case.injected}) {call.summary()}"
    return guarded(fault, lambda: _checked_view_call(variant, att, case, call, fault, what))


# ---- what a view refuses ----------------------------------------------------------------------------------
def _causal_only(recipe: Recipe) -> bool:
    """The recipe's one positional hook is a causal mask alone (cascade levels and diagonal blocks serve it)."""
    return recipe.mask == ("causal",) and "alibi" not in recipe.logits


def _view_refuses(variant: Variant, case: Case) -> bool:
    """Whether the case's view must refuse ``variant``: cascade levels and block rows number their keys from 0,
    so a hook that reads a position (beyond a causal mask alone) is refused; a headwise block-sparse view also
    numbers its heads from 0, so a hook that reads a head index is refused there. Appends refuse none."""
    r = _RECIPES[variant.name]
    if case.kind == "append":
        return False
    positional = bool(r.mask or "alibi" in r.logits) and not _causal_only(r)
    heads = "alibi" in r.logits or "stripe" in r.mask or r.query == "affine" or r.output == "head_bias"
    return positional or (case.kind == "bsr" and case.view["form"] != "shared" and heads)


# -- cascade ------------------------------------------------------------------------------------------------
@dataclass
class Level:
    """A cascade level as drawn: its row groups (``qo`` [G+1]) and each group's page list and keys."""

    qo: np.ndarray
    lists: list  # [G] int32 page ids
    last: np.ndarray  # [G] int32 valid rows of the list's last page (0 for an empty list)
    keys: list  # [G] [n, Hkv, D], as written into the pages
    values: list

    def copy(self) -> "Level":
        return Level(self.qo.copy(), list(self.lists), self.last.copy(), list(self.keys), list(self.values))

    def kv(self, pages, layout: str) -> PagedKV:
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in self.lists])]).astype(np.int32)
        indices = np.concatenate([np.zeros(0, np.int32)] + list(self.lists)).astype(np.int32)
        return PagedKV(pages, indptr, indices, self.last.copy(), layout)


def _level_bounds(rng, req: np.ndarray, causal: bool) -> list:
    """Row boundaries of one to three levels, the last one's a group per request. An earlier level is one group
    (a prompt shared by the batch, which plan splits into chunks), keeps some of the next one's boundaries
    (nested), or, for a variant without positions now and then, cuts rows anywhere."""
    total, bounds = int(req[-1]), [req]
    for _ in range(int(rng.integers(0, 3))):
        below = bounds[0]
        if rng.random() < 0.35:
            inner = np.zeros(0, np.int32)
        elif not causal and rng.random() < 0.3:
            inner = np.sort(rng.integers(0, total + 1, int(rng.integers(0, 4))))
        else:
            inner = below[1:-1][rng.random(max(len(below) - 2, 0)) < 0.4]
        bounds.insert(0, np.concatenate([[0], inner, [total]]).astype(np.int32))
    return bounds


def _level_lengths(rng, bounds: list, causal: bool, ps: int) -> list:
    """Keys of every group of every level: earlier levels whole pages (a partial last page at times), the last
    level any length (a causal variant's: at least its group's rows, the tokens of its own queries)."""
    lengths = []
    for i, b in enumerate(bounds):
        for rows in np.diff(b):
            if i == len(bounds) - 1:
                lengths.append(int(rows) + int(rng.integers(0, 6)) if causal else int(rng.integers(0, 10)))
            else:
                cut = int(rng.integers(1, ps)) if ps > 1 and rng.random() < 0.3 else 0
                lengths.append(max(0, int(rng.integers(0, 6)) * ps - cut))
    return lengths


def _segments(levels: list, total: int):
    """The cascade's row groups as one flat batch: the union of every level's boundaries, and for each segment
    the group of every level that holds its rows. Returns (cuts [S+1] int32, [[group per level] per segment])."""
    cuts = np.unique(np.concatenate([lv.qo for lv in levels] + [np.array([0, total])])).astype(np.int32)
    return cuts, [[int(np.searchsorted(lv.qo, a, side="right")) - 1 for lv in levels] for a in cuts[:-1]]


def _make_cascade(variant: Variant, rng, head_dim: int) -> Case:
    """Levels over one paged cache (random page permutation, spare pages), in a random mode and chunking."""
    causal = _causal_only(_RECIPES[variant.name])
    req = np.concatenate([[0], np.cumsum(_batch_lens(rng))]).astype(np.int32)
    bounds = _level_bounds(rng, req, causal)
    n_kv = int(rng.integers(1, 3))
    n_qo, layout, ps = n_kv * int(rng.integers(1, 4)), str(rng.choice(["NHD", "HND"])), int(rng.choice([1, 3, 4, 16]))
    pages, lists, last, keys, values = _pages_of(rng, _level_lengths(rng, bounds, causal, ps), ps, n_kv, head_dim,
                                                 layout, int(rng.integers(0, 3)))
    levels, at = [], 0
    for b in bounds:
        g = len(b) - 1
        levels.append(Level(b, lists[at:at + g], last[at:at + g], keys[at:at + g], values[at:at + g]))
        at += g
    total = int(req[-1])
    q = rng.standard_normal((total, n_qo, head_dim)).astype(np.float32)
    cuts, groups = _segments(levels, total)
    params = _params(variant, rng, np.diff(cuts).tolist(),
                     [sum(len(lv.keys[g]) for lv, g in zip(levels, gs)) for gs in groups], n_qo, head_dim)
    view = dict(levels=levels, pages=pages, layout=layout, page_size=ps, causal=causal,
                mode=str(rng.choice(["auto", "cascade", "flat"])), max_chunks=int(rng.choice([1, 2, 3, 6, 32])),
                chunk_keys=int(rng.choice([1, 2, ps, 7, 2048])), via=str(rng.choice(["plan", "plan", "run"])),
                unmasked="own" if causal and rng.random() < 0.3 else "none")
    case = Case("cascade", q, req, None, [], [], params, float(rng.choice([1 / np.sqrt(head_dim), 0.05, 1.0])),
                view=view)
    if rng.random() < 0.35:
        _poison(rng, case, [(f"level{i}.{'kv'[h]}[{g}]", (lv.keys, lv.values)[h][g],
                             _slot_copies(pages, layout, lv.lists[g], h))
                            for i, lv in enumerate(levels) for g in range(len(lv.lists)) for h in (0, 1)
                            if len(lv.keys[g])])
    return case


def _flat_refused(levels: list, total: int, ps: int, causal: bool, copied: bool) -> bool:
    """Whether mode="flat" cannot concatenate the levels (README: one cache; per row group at most one page list
    ending on a partial page, and for a causal variant, which keeps the levels' key order, only the last)."""
    if total == 0:
        return False
    if copied and len(levels) > 1:
        return True
    for gs in _segments(levels, total)[1]:
        partial = [lv.last[g] != ps for lv, g in zip(levels, gs) if len(lv.lists[g])]
        if sum(partial) > 1 or (causal and any(partial[:-1])):
            return True
    return False


def _split_group(lv: Level, row: int) -> Level:
    """``lv`` with the group holding ``row`` cut in two there, both halves reading its page list."""
    g = int(np.searchsorted(lv.qo, row, side="right")) - 1
    return Level(np.insert(lv.qo, g + 1, row).astype(np.int32), lv.lists[:g + 1] + lv.lists[g:],
                 np.insert(lv.last, g, lv.last[g]).astype(np.int32), lv.keys[:g + 1] + lv.keys[g:],
                 lv.values[:g + 1] + lv.values[g:])


def _trim_group(lv: Level, g: int, n: int, ps: int) -> Level:
    """``lv`` with group g's keys cut to its first ``n`` (its first pages)."""
    out = lv.copy()
    pages = -(-n // ps)
    out.lists[g], out.keys[g], out.values[g] = lv.lists[g][:pages], lv.keys[g][:n], lv.values[g][:n]
    out.last[g] = n - (pages - 1) * ps if pages else 0
    return out


def _patch_kv(i: int, **fields):
    """A patch of the built levels: level i's PagedKV with ``fields`` (functions of the old value) replaced."""
    def patch(levels):
        kv = levels[i].kv
        levels[i] = CascadeLevel(levels[i].qo_indptr, replace(kv, **{k: f(getattr(kv, k)) for k, f in fields.items()}))
    return patch


def _cascade_fault(variant: Variant, case: Case, call: "ViewCall", fault: str, rng):
    """Spoil a cascade call; returns the names its refusal must hold, None (a valid call) or SKIP."""
    a, total = call.args, int(case.q.shape[0])
    levels, causal, ps = a["levels"], a["causal"], a["page_size"]
    i = int(rng.integers(len(levels)))
    # (page lists of groups with rows: a flat view never reads a group without, nor needs its page table)
    nonempty = [(j, g) for j, lv in enumerate(levels) for g in range(len(lv.lists))
                if len(lv.lists[g]) and lv.qo[g + 1] > lv.qo[g]]
    if fault == "levels_not_nesting":  # a causal cascade's groups must nest; any other's need not
        inner = sorted(set(range(1, total)) - set(levels[-1].qo.tolist()))
        if len(levels) < 2 or not inner:
            return SKIP
        j = int(rng.integers(len(levels) - 1))
        levels[j] = _split_group(levels[j], int(rng.choice(inner)))
        return ("levels[",) if causal else None
    if fault == "last_level_short":  # a causal cascade's last level holds its groups' own tokens; any other's need not
        rows = np.diff(levels[-1].qo)
        if not rows.any():
            return SKIP
        g = int(rng.choice(np.flatnonzero(rows)))
        levels[-1] = _trim_group(levels[-1], g, min(len(levels[-1].keys[g]), int(rows[g]) - 1), ps)
        return ("levels[",) if causal else None
    if fault == "level_qo_not_covering":
        levels[i] = levels[i].copy()
        levels[i].qo[-1] += 1
        return ("levels[",)
    if fault == "plan_rows_mismatch":
        a["via"], a["q_run"] = "plan", np.concatenate([case.q, np.zeros((1,) + case.q.shape[1:], np.float32)])
        return ("plan",)
    if fault == "mode_unknown":
        a["via"], a["mode"] = "plan", "fast"
        return ("mode",)
    if fault == "no_levels":
        a["levels"] = []
        return ("levels",)
    if fault == "chunk_keys_zero":
        a["via"], a["chunk_keys"] = "plan", 0
        return ("chunk_keys",)
    if fault == "level_kv_group_count":
        a["patches"].append(_patch_kv(i, indptr=lambda x: x[:-1], last_page_len=lambda x: x[:-1]))
        return ("levels[", "kv.indptr", "kv.last_page_len")
    if fault in ("level_page_out_of_range", "level_last_page_len_zero"):
        if not nonempty:
            return SKIP
        j, g = nonempty[int(rng.integers(len(nonempty)))]
        if fault == "level_last_page_len_zero":
            a["patches"].append(_patch_kv(j, last_page_len=lambda x: np.where(np.arange(len(x)) == g, 0, x)
                                          .astype(np.int32)))
            return ("last_page_len",)
        n_pages = int(a["pages"].shape[0])
        at = sum(len(p) for p in levels[j].lists[:g]) + int(rng.integers(len(levels[j].lists[g])))
        a["patches"].append(_patch_kv(j, indices=lambda x: np.where(np.arange(len(x)) == at, n_pages + 2, x)
                                      .astype(np.int32)))
        return ("kv.indices", "levels[")
    if fault == "level_pages_copy":  # the same keys in another array: only the flat view needs one cache
        a["level_pages"][i] = a["pages"].copy()
        return None
    if fault == "unmasked_with_mask":  # only a causal variant's cascade takes one, and it must be unmasked
        a["unmasked"] = "masked"
        return ("unmasked",)
    raise ValueError(f"unknown cascade fault {fault!r}")


def _run_cascade(variant: Variant, att, case: Case, call: "ViewCall"):
    a = call.args
    if a["unmasked"] == "none":
        cascade = CascadeAttention(att)
    else:
        cascade = CascadeAttention(att, att.without_mask() if a["unmasked"] == "own" else att)
    levels = [CascadeLevel(lv.qo, lv.kv(a["level_pages"].get(i, a["pages"]), a["layout"]))
              for i, lv in enumerate(a["levels"])]
    for patch in a["patches"]:
        patch(levels)
    q, d = case.q, int(case.q.shape[2])
    scales = a.get("kv_scales", {})  # an fp8 pool's (tests/fuzz_fp8.py)
    if a["via"] == "run":
        out, lse = cascade.run(q, levels, sm_scale=case.sm_scale, params=case.params, **scales)
        plan = cascade.plan(levels, int(q.shape[0]), d)  # (the plan run made: for the record)
    else:
        plan = cascade.plan(levels, int(q.shape[0]), d, mode=a["mode"], max_chunks=a["max_chunks"],
                            chunk_keys=a["chunk_keys"], num_qo_heads=int(q.shape[1]))
        out, lse = cascade.run(a.get("q_run", q), plan=plan, sm_scale=case.sm_scale, params=case.params, **scales)
    call.info["plan"] = f"{plan.mode}:{'+'.join(str(lv.chunks) for lv in plan.levels)}"
    call.info["merged"] = plan.mode == "cascade" and (len(plan.levels) > 1 or any(lv.chunks > 1 for lv in plan.levels))
    return out, lse


def _cascade_reference(variant: Variant, case: Case, call: "ViewCall"):
    """Flat attention of each segment's rows over its levels' keys concatenated in level order."""
    levels = call.args["levels"]
    cuts, groups = _segments(levels, int(case.q.shape[0]))
    keys = [np.concatenate([lv.keys[g] for lv, g in zip(levels, gs)]) for gs in groups]
    values = [np.concatenate([lv.values[g] for lv, g in zip(levels, gs)]) for gs in groups]
    return reference_attention(variant, case.q, keys, values, cuts, case.sm_scale,
                               _with_defaults(variant, case.params))


def _cascade_expected(variant: Variant, case: Case, call: "ViewCall", names):
    """A cascade call in mode "flat" over levels that cannot be concatenated must be refused by mode (a valid
    one), or may be (a spoilt one, whose fault the plan may meet later). A variant with an output transform runs
    flat only (README: the transform would apply to each level before the merge): mode "cascade" is refused by
    mode, and so is any mode over levels that cannot be concatenated (run(levels) plans "auto")."""
    a, total = call.args, int(case.q.shape[0])
    covered = a["levels"] and all(lv.qo[-1] == total for lv in a["levels"])
    flat_only = "output_transform" in variant.hooks
    mode = a["mode"] if a["via"] == "plan" else "auto"
    if flat_only and mode == "cascade":
        return (names or ()) + ("mode='cascade'",)
    if (mode == "flat" or flat_only) and covered and _flat_refused(
            a["levels"], total, a["page_size"], a["causal"], bool(a["level_pages"])):
        return (names or ()) + (f"mode={mode!r}",)
    return names


# -- block-sparse -------------------------------------------------------------------------------------------
def _random_sizes(rng, total: int, n_blocks: int) -> np.ndarray:
    """[n_blocks] positive block sizes summing to ``total`` (n_blocks <= total)."""
    if n_blocks == 0:
        return np.zeros(0, np.int32)
    cuts = np.sort(rng.choice(np.arange(1, total), n_blocks - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int32)


def _fixed_sizes(total: int, block: int) -> np.ndarray:
    """ceil(total / block) blocks of ``block`` rows, the last partial."""
    return np.minimum(block, total - np.arange(-(-total // block)) * block).astype(np.int32)


def _block_masks(rng, heads: int, mb: int, nb: int, causal: bool) -> np.ndarray:
    """[heads, MB, NB] block masks of a random density, some rows reading none; causal (MB = NB): the diagonal
    block in most rows (the others see only earlier blocks), and blocks above it (a causal mask hides them)."""
    blocks = rng.random((heads, mb, nb)) < rng.uniform(0.15, 0.8)
    if causal:
        blocks[:, np.arange(mb), np.arange(mb)] = rng.random((heads, mb)) < 0.7
    blocks[rng.random((heads, mb)) < 0.1] = False
    return blocks


def _bsr_shape(rng, form: str, causal: bool, m: int, n: int, n_kv: int) -> dict:
    """Block sizes of a layout over M query rows and N keys: R x C blocks ("shared", "headwise") or variable
    sizes per head ("variable"); square diagonal blocks for a causal variant (R = C, M = N, rows = columns)."""
    if form == "variable":
        mb = int(rng.integers(1, min(m, 6) + 1)) if m else 0
        nb = mb if causal else int(rng.integers(1, min(n, 6) + 1))
        row_sz = np.stack([_random_sizes(rng, m, mb) for _ in range(n_kv)])
        col_sz = row_sz.copy() if causal else np.stack([_random_sizes(rng, n, nb) for _ in range(n_kv)])
        return dict(r=None, c=None, row_sz=row_sz, col_sz=col_sz)
    c = int(rng.choice([1, 2, 3, 4, 8]))
    r = c if causal else int(rng.choice([1, 2, 3, 4, 8, 16]))
    return dict(r=r, c=c, row_sz=np.tile(_fixed_sizes(m, r), (n_kv, 1)), col_sz=np.tile(_fixed_sizes(n, c), (n_kv, 1)))


def _make_bsr(variant: Variant, rng, head_dim: int) -> Case:
    """A block-sparse view: shared R x C blocks (keys paged one block per page), R x C blocks per KV head, or
    variable blocks per head (keys in pages of any size, repacked); random block masks; a causal variant gets
    square diagonal blocks over M = N rows."""
    causal = _causal_only(_RECIPES[variant.name])
    form = str(rng.choice(["shared", "headwise", "variable"]))
    n_kv = int(rng.integers(1, 4))
    n_qo, layout = n_kv * int(rng.integers(1, 3)), str(rng.choice(["NHD", "HND"]))
    n = int(rng.integers(1, 41))
    m = n if causal else (0 if rng.random() < 0.05 else int(rng.integers(1, 33)))
    shape = _bsr_shape(rng, form, causal, m, n, n_kv)
    mb, nb = shape["row_sz"].shape[1], shape["col_sz"].shape[1]
    blocks = _block_masks(rng, 1 if form == "shared" else n_kv, mb, nb, causal)
    k, v = rng.standard_normal((2, n, n_kv, head_dim)).astype(np.float32)
    s = shape["c"] if form == "shared" else int(rng.choice([1, 3, 4, shape["c"] or 2, n]))
    view = dict(form=form, causal=causal, m=m, n=n, blocks=blocks, k=k, v=v, layout=layout, page_size=s,
                pages=stored_pages(k, v, s, layout, int(rng.integers(0, 3))), bsr=None, q=None,
                via=str(rng.choice(["run", "as_paged"] if form == "shared" and not causal else
                                   ["run", "mask"] if form == "variable" else ["run"])),
                buffers=bool(rng.random() < 0.5), **shape)
    q = rng.standard_normal((m, n_qo, head_dim)).astype(np.float32)
    case = Case("bsr", q, np.array([0, m], np.int32), None, [], [], _params(variant, rng, [m], [n], n_qo, head_dim),
                float(rng.choice([1 / np.sqrt(head_dim), 0.05, 1.0])), view=view)
    if rng.random() < 0.35:
        # (a key row of every stored copy: its page and place; the pages hold keys 0..N-1 in order)
        _poison(rng, case, [("k", k, _slot_copies(view["pages"], layout, np.arange(view["pages"].shape[0]), 0)),
                            ("v", v, _slot_copies(view["pages"], layout, np.arange(view["pages"].shape[0]), 1))])
    return case


def _bsr_layout(a: dict) -> tuple[list, list]:
    """Per-head (indptr, indices) of the block masks (a shared view: its one layout), unless a fault gave its own."""
    if a["bsr"] is not None:
        return a["bsr"]
    return ([np.concatenate([[0], np.cumsum(b.sum(1))]).astype(np.int32) for b in a["blocks"]],
            [np.nonzero(b)[1].astype(np.int32) for b in a["blocks"]])


def _bsr_view(a: dict):
    if a["form"] == "variable" and a["via"] == "mask" and a["bsr"] is None:
        return HeadwiseBlockSparseView.from_block_mask(a["blocks"], a["row_sz"], a["col_sz"])
    ip, ix = _bsr_layout(a)
    if a["form"] == "shared":
        return BlockSparseView(ip[0], ix[0], a["r"], a["m"], a["n"])
    if a["form"] == "headwise":
        return HeadwiseBlockSparseView.uniform(ip, ix, a["r"], a["c"], a["m"], a["n"])
    return HeadwiseBlockSparseView(tuple(ip), tuple(ix), tuple(a["row_sz"]), tuple(a["col_sz"]))


def _bsr_fault(variant: Variant, case: Case, call: "ViewCall", fault: str, rng):
    """Spoil a block-sparse call; returns the names its refusal must hold, None (a valid call) or SKIP."""
    a = call.args
    ip, ix = (list(x) for x in _bsr_layout(a))
    h = int(rng.integers(len(ip)))
    rows = np.flatnonzero(np.diff(ip[h]))
    if fault in ("bsr_index_out_of_range", "bsr_unsorted"):
        if not len(rows):
            return SKIP
        row = int(rng.choice(rows))
        at = int(ip[h][row])
        if fault == "bsr_index_out_of_range":
            ix[h] = ix[h].copy()
            ix[h][at] = a["col_sz"][h].shape[0] + int(rng.integers(0, 3))
        else:  # a key block listed twice in its row
            ix[h] = np.insert(ix[h], at, ix[h][at]).astype(np.int32)
            ip[h] = (ip[h] + (np.arange(len(ip[h])) > row)).astype(np.int32)
        a["bsr"] = (ip, ix)
        return ("indices",)
    if fault in ("bsr_indptr_count", "bsr_indptr_end"):
        if fault == "bsr_indptr_count":  # one entry more than block rows + 1
            ip[h] = np.append(ip[h], ip[h][-1]).astype(np.int32)
        else:  # ending past the last index
            ip[h] = ip[h].copy()
            ip[h][-1] += 1
        a["bsr"] = (ip, ix)
        return ("indptr",)
    if fault == "bsr_not_square":  # a causal variant needs square diagonal blocks; any other takes these
        if a["form"] == "variable":
            mb = a["row_sz"].shape[1]
            mb = mb + 1 if a["m"] > mb else mb - 1
            if mb < 1:
                return SKIP
            a["row_sz"] = np.stack([_random_sizes(rng, a["m"], mb) for _ in range(len(a["row_sz"]))])
        else:
            a["r"] = a["c"] + 1
            a["row_sz"] = np.tile(_fixed_sizes(a["m"], a["r"]), (len(a["row_sz"]), 1))
        a["blocks"] = _block_masks(rng, len(a["blocks"]), a["row_sz"].shape[1], a["col_sz"].shape[1], False)
        if a["via"] == "mask":
            a["via"] = "run"
        square = a["row_sz"].shape == a["col_sz"].shape and np.array_equal(a["row_sz"], a["col_sz"])  # (M <= R, C)
        return ("view",) if a["causal"] and not square else None
    if fault == "bsr_too_few_pages":
        a["pages"] = a["pages"][:-(-a["n"] // a["page_size"]) - 1]
        return ("pages",)
    if fault == "bsr_kv_heads_mismatch":  # (a headwise view has one layout per KV head)
        if a["form"] == "shared":
            return SKIP
        axis = 3 if a["layout"] == "NHD" else 2
        a["pages"] = np.concatenate([a["pages"], np.take(a["pages"], [0], axis=axis)], axis=axis)
        return ("pages",)
    if fault == "bsr_q_rows":
        a["q"] = np.concatenate([case.q, np.zeros((1,) + case.q.shape[1:], np.float32)])
        return ("q:", "qo_indptr:")
    if fault == "bsr_block_rows_zero":
        if a["form"] == "variable":
            if not a["row_sz"].size:
                return SKIP
            a["row_sz"] = a["row_sz"].copy()
            a["row_sz"][h, 0] = 0
            a["via"] = "run"
            return ("block_row_sz",)
        a["r"] = 0
        return ("block_rows",)
    if fault == "bsr_layout_unknown":
        a["layout"] = "NDH"
        return ("layout",)
    if fault == "bsr_sizes_mismatch":
        if a["form"] != "variable" or len(a["col_sz"]) < 2:
            return SKIP
        a["col_sz"] = a["col_sz"].copy()
        a["col_sz"][1, -1] += 1
        a["via"] = "run"
        return ("block_col_sz",)
    if fault == "bsr_out_wrong_shape":
        a["out"] = np.zeros((case.q.shape[0] + 1,) + case.q.shape[1:], np.float32)
        return ("out",)
    if fault == "bsr_view_wrong_type":
        a["via"], a["view"] = "run", tuple(_bsr_layout(a))
        return ("view",)
    raise ValueError(f"unknown bsr fault {fault!r}")


def _run_bsr(variant: Variant, att, case: Case, call: "ViewCall"):
    a = call.args
    bsa = BlockSparseAttention(att)
    view = a["view"] if "view" in a else _bsr_view(a)
    q = case.q if a["q"] is None else a["q"]
    out, lse = a.get("out"), None
    if a["buffers"] and out is None:  # NaN-filled outputs: every row must be written
        out, lse = np.full(q.shape, np.nan, np.float32), np.full(q.shape[:2], np.nan, np.float32)
    scales = a.get("kv_scales", {})  # an fp8 pool's (tests/fuzz_fp8.py)
    if a["via"] == "as_paged":
        qo_indptr, kv = view.as_paged(a["pages"], a["layout"])
        return att.prefill(q, kv, qo_indptr, sm_scale=case.sm_scale, params=case.params, out=out, lse=lse, **scales)
    return bsa.run(q, a["pages"], view, layout=a["layout"], sm_scale=case.sm_scale, params=case.params, out=out,
                   lse=lse, **scales)


def _bsr_mask(a: dict) -> np.ndarray:
    """[Hkv, M, N] keys each query row of each KV head sees: its block rows' key blocks (and, for a causal
    variant, keys at or before its own position)."""
    n_kv = len(a["row_sz"])
    blocks = np.broadcast_to(a["blocks"], (n_kv,) + a["blocks"].shape[1:])
    mask = np.stack([np.repeat(np.repeat(b, rs, 0), cs, 1) for b, rs, cs in zip(blocks, a["row_sz"], a["col_sz"])])
    return mask & np.tri(a["m"], a["n"], dtype=bool)[None] if a["causal"] else mask


def _bsr_reference(variant: Variant, case: Case, call: "ViewCall"):
    """Dense attention under the view's mask: one reference over every head (a shared layout), or one per KV
    head and its query heads (a headwise one, whose variants read no head index)."""
    a, q = call.args, case.q
    mask, params = _bsr_mask(a), _with_defaults(variant, case.params)
    if a["form"] == "shared":
        return _rows_reference(variant, q, a["k"], a["v"], mask[0], case.sm_scale, params)
    n_kv = len(mask)
    group = int(q.shape[1]) // n_kv
    o, lse = np.zeros(q.shape), np.zeros(q.shape[:2])
    for h in range(n_kv):
        heads = slice(h * group, (h + 1) * group)
        o[:, heads], lse[:, heads] = _rows_reference(variant, q[:, heads], a["k"][:, h:h + 1], a["v"][:, h:h + 1],
                                                     mask[h], case.sm_scale, params)
    return o, lse


# -- append -------------------------------------------------------------------------------------------------
def _make_append(variant: Variant, rng, head_dim: int) -> Case:
    """A grown view over a paged cache (random page permutation, spare pages) that already counts each request's
    new rows (FlashInfer's convention), their slots scribbled NaN: ``append_paged_kv`` must write them; then a
    prefill of the new rows as queries, or a decode step, reads the cache."""
    new = _batch_lens(rng)
    batch = len(new)
    old = [0 if rng.random() < 0.2 else int(rng.integers(0, 10)) for _ in range(batch)]
    read = str(rng.choice(["prefill", "decode"]))
    qo_lens = new if read == "prefill" else [1] * batch
    if variant.param("mask_bits") is not None:  # a custom mask's rows are the request's own
        old = [max(o, q - n) for o, n, q in zip(old, new, qo_lens)]
    lens = [o + n for o, n in zip(old, new)]
    n_kv = int(rng.integers(1, 3))
    n_qo, layout, ps = n_kv * int(rng.integers(1, 4)), str(rng.choice(["NHD", "HND"])), int(rng.choice([1, 3, 4, 16]))
    pages, lists, last, keys, values = _pages_of(rng, lens, ps, n_kv, head_dim, layout, int(rng.integers(0, 4)))
    kv = PagedKV(pages, np.concatenate([[0], np.cumsum([len(p) for p in lists])]).astype(np.int32),
                 np.concatenate([np.zeros(0, np.int32)] + lists).astype(np.int32), last, layout)
    slots = np.array([int(lists[b][j // ps]) * ps + j % ps for b in range(batch) for j in range(old[b], lens[b])],
                     np.int64)
    new_k = np.concatenate([np.zeros((0, n_kv, head_dim), np.float32)] + [keys[b][old[b]:] for b in range(batch)])
    new_v = np.concatenate([np.zeros((0, n_kv, head_dim), np.float32)] + [values[b][old[b]:] for b in range(batch)])
    for half in (0, 1):
        _write_slots(pages, layout, slots, half, np.float32(np.nan))
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo_indptr[-1]), n_qo, head_dim)).astype(np.float32)
    view = dict(k=new_k, v=new_v, append_indptr=np.concatenate([[0], np.cumsum(new)]).astype(np.int32), slots=slots,
                old=old, lens=lens, read=read, page_size=ps, layout=layout)
    case = Case("append", q, qo_indptr, kv, keys, values, _params(variant, rng, qo_lens, lens, n_qo, head_dim),
                float(rng.choice([1 / np.sqrt(head_dim), 0.05, 1.0])), view=view)
    if rng.random() < 0.35:
        starts = np.concatenate([[0], np.cumsum(new)])
        rows = [(f"req{b}.{'kv'[h]}", (keys, values)[h][b], _append_copies((new_k, new_v)[h], int(starts[b]), old[b],
                                                                             pages, layout, lists[b], h))
                for b in range(batch) for h in (0, 1) if lens[b]]
        _poison(rng, case, rows)
    return case


def _append_copies(rows, start: int, old: int, pages, layout: str, page_list, half: int):
    """The other copies of a request's key row j: the appended rows' (a new row) or the pages' (an old row)."""
    in_pages = _slot_copies(pages, layout, page_list, half)

    def at(spot):
        j, h, d = spot
        return [(rows, (start + j - old, h, d))] if j >= old else in_pages(spot)
    return at


def _append_fault(variant: Variant, case: Case, call: "ViewCall", fault: str, rng):
    """Spoil an append; returns the names its refusal must hold, or SKIP. A refused append writes nothing."""
    a, kv = call.args, call.args["kv"]
    ps, new = a["page_size"], np.diff(a["append_indptr"])
    batch, lens = len(new), np.array(a["lens"], np.int64)
    growing = np.flatnonzero(new > 0)
    if fault == "append_more_rows":
        if not batch:
            return SKIP
        b = int(rng.integers(batch))
        more = new.copy()
        more[b] = lens[b] + 1
        a["append_indptr"] = np.concatenate([[0], np.cumsum(more)]).astype(np.int32)
        a["k"] = a["v"] = np.zeros((int(more.sum()),) + a["k"].shape[1:], np.float32)
        return ("append_indptr",)
    if fault in ("append_indptr_count", "append_indptr_int64"):
        ai = a["append_indptr"]
        a["append_indptr"] = np.append(ai, ai[-1]).astype(np.int32) if fault == "append_indptr_count" else \
            ai.astype(np.int64)
        return ("append_indptr",)
    if fault == "append_k_shape":
        a["k"] = np.zeros(a["k"].shape[:2] + (a["k"].shape[2] * 2,), np.float32)
        return ("k:",)
    if fault == "append_v_dtype":
        a["v"] = a["v"].astype(np.float16)
        return ("v:",)
    if fault == "append_scale_given":
        a["scales"] = {"k_scale": 1.0}
        return ("k_scale",)
    if fault == "append_last_page_len":
        has = np.flatnonzero(np.diff(kv.indptr) > 0)
        if not len(has):
            return SKIP
        last = kv.last_page_len.copy()
        last[int(rng.choice(has))] = 0 if rng.random() < 0.5 else ps + 1
        a["kv"] = replace(kv, last_page_len=last)
        return ("kv.last_page_len",)
    if fault in ("append_slot_out_of_range", "append_slot_negative"):
        if not len(growing):
            return SKIP
        b = int(rng.choice(growing))
        idx = kv.indices.copy()
        idx[kv.indptr[b] + (lens[b] - 1) // ps] = -1 if fault == "append_slot_negative" else \
            kv.pages.shape[0] + int(rng.integers(0, 3))
        a["kv"] = replace(kv, indices=idx)
        return ("kv.indices",)
    if fault == "append_shared_slot":  # request b2's last new row on request b1's
        if len(growing) < 2:
            return SKIP
        b1, b2 = (int(b) for b in rng.choice(growing, 2, replace=False))
        n_pages = int(kv.indptr[b2 + 1] - kv.indptr[b2])
        if new[b2] > (n_pages - 1) * ps + int(kv.last_page_len[b1]):
            return SKIP
        idx, last = kv.indices.copy(), kv.last_page_len.copy()
        idx[kv.indptr[b2 + 1] - 1], last[b2] = idx[kv.indptr[b1 + 1] - 1], last[b1]
        a["kv"] = replace(kv, indices=idx, last_page_len=last)
        return ("kv.indices",)
    if fault == "append_layout_unknown":
        a["kv"] = replace(kv, layout="NDH")
        return ("kv.layout",)
    if fault == "append_kv_ragged":
        a["kv"] = RaggedKV(a["k"], a["v"], a["append_indptr"])
        return ("kv",)
    if fault == "append_rows_torch":
        import torch

        a["k"] = torch.from_numpy(a["k"])
        return ("k, v",)
    if fault.startswith("append_pool_"):  # a valid call: the append writes, and the read reads, through the view
        pool = replace(kv, pages=pool_in_form(kv.pages, fault[len("append_"):]))
        a["kv"] = a["read_kv"] = pool
        return None
    if fault == "append_indptr_past_end":
        a["kv"] = replace(kv, indptr=(kv.indptr + np.int32(len(kv.indices) + 1) * (np.arange(batch + 1) == batch))
                          .astype(np.int32))
        return ("kv.indptr", "kv.last_page_len")
    raise ValueError(f"unknown append fault {fault!r}")


def _run_append(variant: Variant, att, case: Case, call: "ViewCall"):
    a = call.args
    append_paged_kv(a["kv"], a["k"], a["v"], a["append_indptr"], **a["scales"])
    _check_pages(call, written=True)
    if a["read"] == "decode":
        return att.decode(case.q, a["read_kv"], sm_scale=case.sm_scale, params=case.params)
    return att.prefill(case.q, a["read_kv"], case.qo_indptr, sm_scale=case.sm_scale, params=case.params)


def _check_pages(call: "ViewCall", written: bool) -> None:
    """The pages after an append: the new rows at their slots (worked out when drawn) and nothing else changed;
    after a refused one, nothing changed."""
    a = call.args
    want = a["before"].copy()
    if written:
        for half, rows in enumerate((a["k"], a["v"])):
            _write_slots(want, a["layout"], a["slots"], half, rows)
    got = a["read_kv"].pages
    if not np.array_equal(got, want, equal_nan=True):
        bad = np.argwhere(~((got == want) | (np.isnan(got) & np.isnan(want))))[:4].tolist()
        raise FuzzFailure(f"append: the pages differ from {'the append' if written else 'before'} at {bad} "
                          f"(page, half, ...), slots {a['slots'].tolist()}")


def _append_reference(variant: Variant, case: Case, call: "ViewCall"):
    qo_indptr = case.qo_indptr if call.args["read"] == "prefill" else np.arange(len(case.keys) + 1)
    return reference_attention(variant, case.q, case.keys, case.values, qo_indptr, case.sm_scale,
                               _with_defaults(variant, case.params))


# -- the views' faults and oracle ---------------------------------------------------------------------------
VIEW_FAULTS = {
    "cascade": ("none", "levels_not_nesting", "last_level_short", "level_qo_not_covering", "plan_rows_mismatch",
                "mode_unknown", "no_levels", "chunk_keys_zero", "level_kv_group_count", "level_page_out_of_range",
                "level_last_page_len_zero", "level_pages_copy", "unmasked_with_mask"),
    "bsr": ("none", "bsr_index_out_of_range", "bsr_unsorted", "bsr_indptr_count", "bsr_indptr_end", "bsr_not_square",
            "bsr_too_few_pages", "bsr_kv_heads_mismatch", "bsr_q_rows", "bsr_block_rows_zero", "bsr_layout_unknown",
            "bsr_sizes_mismatch", "bsr_out_wrong_shape", "bsr_view_wrong_type"),
    "append": ("none", "append_more_rows", "append_indptr_count", "append_indptr_int64", "append_k_shape",
               "append_v_dtype", "append_scale_given", "append_last_page_len", "append_slot_out_of_range",
               "append_slot_negative", "append_shared_slot", "append_layout_unknown", "append_kv_ragged",
               "append_rows_torch", "append_indptr_past_end", "append_pool_vllm", "append_pool_pair",
               "append_pool_gapped"),
}


@dataclass
class ViewCall:
    """A view call: its parts (the case's, copied, then spoilt), the names its refusal must hold (None: a valid
    call, which must match the reference), and what the run found out (a cascade's plan)."""

    kind: str
    args: dict
    names: tuple | None = None
    info: dict = field(default_factory=dict)

    def summary(self) -> str:
        keys = {"cascade": ("mode", "via", "max_chunks", "chunk_keys", "unmasked", "page_size", "layout"),
                "bsr": ("form", "via", "r", "c", "m", "n", "page_size", "layout"),
                "append": ("read", "page_size", "layout")}[self.kind]
        return " ".join(f"{k}={self.args[k]}" for k in keys if k in self.args)


def _view_args(case: Case) -> dict:
    """The case's view parts, copied where a fault or the call writes."""
    a = dict(case.view)
    if case.kind == "cascade":
        a.update(levels=[lv.copy() for lv in a["levels"]], level_pages={}, patches=[])
    elif case.kind == "append":
        pages = case.kv.pages.copy()
        a.update(read_kv=replace(case.kv, pages=pages), before=pages.copy(), scales={})
        a["kv"] = a["read_kv"]
    return a


def apply_view_fault(variant: Variant, case: Case, fault: str, rng) -> ViewCall | None:
    """The view call of ``case`` with ``fault`` (one of ``VIEW_FAULTS[case.kind]``); None where it does not apply.
    A variant the view must refuse (``_view_refuses``) adds "variant" to what the refusal may name."""
    call = ViewCall(case.kind, _view_args(case))
    names = None
    if fault != "none":
        names = _VIEW_FAULTERS[case.kind](variant, case, call, fault, rng)
        if isinstance(names, str):
            return None
    if case.kind == "cascade":
        names = _cascade_expected(variant, case, call, names)
    if _view_refuses(variant, case):
        names = (names or ()) + ("variant",)
    call.names = names
    return call


def _checked_view_call(variant: Variant, att, case: Case, call: ViewCall, fault: str, what: str) -> str:
    """run_case for a view kind: "ok" or "refused:<Error>"; raises FuzzFailure."""
    try:
        out, lse = _VIEW_RUNNERS[case.kind](variant, att, case, call)
    except ATTNGEN_ERRORS as e:
        msg = call.info["refusal"] = str(e)
        if call.names is None:
            raise FuzzFailure(f"{what}: a valid call was refused: {type(e).__name__}: {msg}") from e
        if not any(n in msg for n in call.names):
            raise FuzzFailure(f"{what}: the refusal names none of {call.names}: {msg!r}") from e
        if case.kind == "append":
            _check_pages(call, written=False)
        return f"refused:{type(e).__name__}"
    except FuzzFailure:
        raise
    except Exception as e:  # anything else is a crash of attngen's own checks
        raise FuzzFailure(f"{what}: {type(e).__name__} instead of an attngen error: {e}") from e
    if call.names is not None:
        raise FuzzFailure(f"{what}: the spoilt call was accepted (a refusal naming one of {call.names} was due)")
    ref_o, ref_l = _VIEW_REFERENCES[case.kind](variant, case, call)
    what = f"{what} plan={call.info['plan']}" if "plan" in call.info else what
    if (case.kind == "cascade" and call.info.get("merged") and "output_transform" in variant.hooks
            and int(case.q.shape[0]) > 0):
        raise FuzzFailure(f"{what}: a variant with an output transform ran a merged cascade")
    _compare(out, lse, ref_o, ref_l, what)
    return "ok"


_VIEW_MAKERS = {"cascade": _make_cascade, "bsr": _make_bsr, "append": _make_append}
_VIEW_FAULTERS = {"cascade": _cascade_fault, "bsr": _bsr_fault, "append": _append_fault}
_VIEW_RUNNERS = {"cascade": _run_cascade, "bsr": _run_bsr, "append": _run_append}
_VIEW_REFERENCES = {"cascade": _cascade_reference, "bsr": _bsr_reference, "append": _append_reference}
