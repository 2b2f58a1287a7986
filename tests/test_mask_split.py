"""The mask hook split into row terms and a per-score rest (codegen/mask_split.py): the pair gives the
hook's visibility on random inputs (float64 interpreter), reads each row-invariant value once per row,
inside its tensor's bounds, and leaves masks without such reads whole."""
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm

from attngen.codegen.hooks_cuda import lower_hooks_cuda
from attngen.codegen.mask_split import MAX_TERMS, split_mask
from attngen.ir import tir_utils as tu
from attngen.ir.tir_eval import TIREvaluator, bind_params, eval_scalar_hook
from attngen.variants import builtin

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
import document_mask  # noqa: E402
import prefix_lm  # noqa: E402

N = 301


def _params(variant, rng, batch, length):
    if variant.name == "document_mask":
        return {"doc_ids": np.cumsum(rng.random((batch, length)) < 0.05, axis=1).astype(np.int32)}
    return {"prefix_len": rng.integers(0, length, size=batch).astype(np.int32)}


@pytest.mark.parametrize("variant", [document_mask.variant, prefix_lm.variant], ids=lambda v: v.name)
def test_the_pair_gives_the_hooks_visibility(variant, rng):
    func = variant.hooks["logits_mask"]
    ms = split_mask(func)
    assert ms is not None and ms.n_terms == 1
    batch, length = 3, 200
    extras = _params(variant, rng, batch, length)
    b = rng.integers(0, batch, N)
    qo_pos, kv_pos = rng.integers(0, length, N), rng.integers(0, length, N)
    qo_head = rng.integers(0, 8, N)
    kv_head = qo_head // 4
    want = eval_scalar_hook(func, [b, qo_pos, kv_pos, qo_head, kv_head], extras)
    ev = TIREvaluator(bind_params(ms.row, [b, qo_pos, qo_head, kv_head, None], extras))
    ev.clip_loads = True  # the guarded read's untaken lane
    rt = np.zeros((MAX_TERMS, N), np.int64)
    for i, store in enumerate(tu.collect(ms.row.body, tvm.tirx.BufferStore)):
        rt[i] = ev.expr(store.value)
    got = eval_scalar_hook(ms.score, [b, qo_pos, kv_pos, qo_head, kv_head, rt], extras)
    np.testing.assert_array_equal(np.asarray(got, bool), np.asarray(want, bool))
    assert np.asarray(want, bool).any() and not np.asarray(want, bool).all()


def test_the_row_read_is_bounded_and_leaves_the_per_score_rest():
    ms = split_mask(document_mask.variant.hooks["logits_mask"])
    ((var, read),), rest = ms.per_score()
    assert str(rest) == f"kv_pos <= qo_pos and {var} == rt[0]"
    # the key's document id is read up front, inside the tensor's bounds: the mask may run for any key
    assert "doc_ids[batch, kv_pos]" in str(read) and "kv_pos < max_len" in str(read) and "batch < nbatch" in str(read)
    assert ms.total
    (store,) = tu.collect(ms.row.body, tvm.tirx.BufferStore)
    assert "qo_pos < max_len" in str(store.value) and "if_then_else" in str(store.value)
    code = lower_hooks_cuda(document_mask.variant, 128, "sm_90a").code
    assert "attngen_document_mask_d128_mask_row_terms(" in code and "attngen_document_mask_d128_mask_from_terms(" in code


@pytest.mark.parametrize("name", ["custom_mask", "sliding_window_causal", "causal"])
def test_masks_without_row_invariant_reads_stay_whole(name):
    v = builtin(name)
    assert "logits_mask" not in v.hooks or split_mask(v.hooks["logits_mask"]) is None


def test_inspect_shows_the_masks_row_terms(capsys):
    from attngen.cli import main

    assert main(["inspect", str(Path(__file__).parents[1] / "examples" / "prefix_lm.py")]) == 0
    text = capsys.readouterr().out
    assert "rt[0] = prefix_len[batch]" in text and "per score: kv_pos < rt[0] or kv_pos <= qo_pos" in text


def test_an_indirect_read_keeps_the_rest_lazy():
    """A read through another read's value may lie out of bounds where the hook's own tests would not reach
    it: the rest stays as the hook wrote it, and the templates evaluate it only for visible keys."""
    from tvm.script import tirx as T

    @T.prim_func
    def indirect(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                 a_ptr: T.handle, b_ptr: T.handle) -> T.bool:
        n = T.int32()
        m = T.int32()
        a = T.match_buffer(a_ptr, (n,), "int32")
        b = T.match_buffer(b_ptr, (m,), "int32")
        return kv_pos <= qo_pos and a[b[kv_pos]] == a[qo_pos]

    ms = split_mask(indirect)
    assert ms is not None and ms.n_terms == 1 and not ms.total
    reads, rest = ms.per_score()
    assert reads == [] and str(rest) == "kv_pos <= qo_pos and a[b[kv_pos]] == rt[0]"


def test_a_division_keeps_the_rest_lazy():
    """Evaluated for every key and row, a division could meet a divisor the hook never saw (0 for rows past
    a request): such a rest is not total."""
    from tvm.script import tirx as T

    @T.prim_func
    def striped(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                a_ptr: T.handle) -> T.bool:
        n = T.int32()
        a = T.match_buffer(a_ptr, (n,), "int32")
        return kv_pos <= qo_pos and kv_pos % a[qo_pos] == 0

    ms = split_mask(striped)
    assert ms is not None and ms.n_terms == 1 and not ms.total


def test_the_document_masks_key_term_holds_wherever_a_pair_is_visible(rng):
    """The key term (the document id a conjunct compares with rt[0]) equals the row term at every visible pair:
    the tile-map classifier's range test skips only tiles without one."""
    func = document_mask.variant.hooks["logits_mask"]
    ms = split_mask(func)
    assert ms.key is not None and ms.key_of == 0
    assert "doc_ids[batch, kv_pos]" in str(ms.key.body.value) and "kv_pos < max_len" in str(ms.key.body.value)
    batch, length = 3, 200
    extras = _params(document_mask.variant, rng, batch, length)
    b, qo_pos, kv_pos = rng.integers(0, batch, N), rng.integers(0, length, N), rng.integers(0, length, N)
    qo_pos = np.where(rng.random(N) < 0.5, kv_pos + rng.integers(0, 4, N), qo_pos).clip(0, length - 1)  # near pairs
    heads = rng.integers(0, 2, N)
    visible = np.asarray(eval_scalar_hook(func, [b, qo_pos, kv_pos, heads, heads], extras), bool)
    key = np.asarray(eval_scalar_hook(ms.key, [b, kv_pos, heads], extras))
    row = extras["doc_ids"][b, qo_pos]
    assert visible.any() and (key[visible] == row[visible]).all()
    assert (key == extras["doc_ids"][b, kv_pos]).all()


def test_a_comparison_with_a_read_of_the_query_or_not_in_the_conjunction_is_no_key_term():
    """Only an equality conjunct of the whole mask whose other side reads by key variables alone is a key term:
    a prefix-LM has none, nor a read indexed by the query position, nor an equality under an or."""
    from tvm.script import tirx as T

    @T.prim_func
    def shifted(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                a_ptr: T.handle) -> T.bool:
        n = T.int32()
        a = T.match_buffer(a_ptr, (n,), "int32")
        return kv_pos <= qo_pos and a[kv_pos + qo_pos] == a[qo_pos]

    @T.prim_func
    def either(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
               a_ptr: T.handle) -> T.bool:
        n = T.int32()
        a = T.match_buffer(a_ptr, (n,), "int32")
        return kv_pos < 4 or a[kv_pos] == a[qo_pos]

    for func in (prefix_lm.variant.hooks["logits_mask"], shifted, either):
        ms = split_mask(func)
        assert ms is not None and ms.key is None and ms.key_of == -1


def test_inspect_shows_the_key_term(capsys):
    from attngen.cli import main

    assert main(["inspect", str(Path(__file__).parents[1] / "examples" / "document_mask.py")]) == 0
    text = capsys.readouterr().out
    assert "key term: " in text and "doc_ids[batch, kv_pos]" in text.split("key term: ")[1].split("\n")[0]
