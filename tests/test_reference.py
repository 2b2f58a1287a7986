"""The float64 reference: the TIR interpreter against hand-written NumPy, and gather_pages."""
import numpy as np

from attngen.ir.tir_eval import apply_hook, eval_row_hook, eval_scalar_hook
from attngen.runtime import gather_pages, pack_custom_mask, reference_attention
from attngen.variants import builtin


def test_interpreter_softcap_matches_numpy(rng):
    f = builtin("logits_softcap").hooks["logits_transform"]
    s = rng.standard_normal((3, 4, 5)) * 20
    got = eval_scalar_hook(f, [s, 0, 0, 0, 0, 0], {"soft_cap": 7.0})
    assert np.allclose(got, 7.0 * np.tanh(s / 7.0), rtol=0, atol=1e-12)


def test_interpreter_rope_matches_numpy(rng):
    f = builtin("rope").hooks["query_transform"]
    d = 16
    x = rng.standard_normal((6, d))
    pos = np.arange(6)[:, None]
    got = eval_row_hook(f, x, [pos[:, 0], 0], {"rope_scale": 2.0, "rope_theta": 500.0})
    half = d // 2
    inv = 500.0 ** (-2 * np.arange(half) / d)
    ang = pos / 2.0 * inv[None, :]
    want = np.concatenate([x[:, :half] * np.cos(ang) - x[:, half:] * np.sin(ang),
                           x[:, half:] * np.cos(ang) + x[:, :half] * np.sin(ang)], axis=1)
    assert np.allclose(got, want, atol=1e-12)


def test_interpreter_custom_mask_reads_bits():
    f = builtin("custom_mask").hooks["logits_mask"]
    m = np.array([[1, 0, 1], [0, 1, 1]], bool)  # qo_len 2, kv_len 3: query rows at positions 1, 2
    params = pack_custom_mask([m], [3])
    qo_pos = np.array([1, 2])[:, None]
    kv_pos = np.arange(3)[None, :]
    got = eval_scalar_hook(f, [0, qo_pos, kv_pos, 0, 0], params)
    assert np.array_equal(got, m)


def test_absent_hooks_are_identities(rng):
    v = builtin("vanilla")
    rows, s = rng.standard_normal((3, 2, 8)), rng.standard_normal((2, 3, 4))
    scores = dict(s=s, batch=0, qo_pos=0, kv_pos=0, qo_head=0, kv_head=0)
    assert apply_hook(v, "query_transform", dict(qo_pos=0, qo_head=0), {}, rows) is rows
    assert apply_hook(v, "logits_transform", scores, {}) is s
    assert apply_hook(v, "logits_mask", scores, {}) == np.True_


def test_reference_softmax_is_normalised(rng):
    v = builtin("vanilla")
    q = rng.standard_normal((2, 2, 8))
    k = rng.standard_normal((5, 1, 8))
    vals = np.ones((5, 1, 8))
    o, lse = reference_attention(v, q, [k], [vals], np.array([0, 2]), 0.3)
    assert np.allclose(o, 1.0)  # softmax weights sum to one
    s = np.einsum("ihd,jd->ihj", q, k[:, 0]) * 0.3
    assert np.allclose(lse, np.log2(np.exp(s).sum(-1)))


def test_gather_pages_both_layouts(rng):
    pages = rng.standard_normal((5, 2, 4, 3, 8))
    indptr = np.array([0, 2, 2, 3], np.int32)
    idx = np.array([4, 1, 0], np.int32)
    last = np.array([3, 0, 4], np.int32)
    k, v = gather_pages(pages, indptr, idx, last)
    assert [x.shape[0] for x in k] == [7, 0, 4]
    assert np.array_equal(k[0][4:], pages[1, 0, :3]) and np.array_equal(v[2], pages[0, 1])
    k2, v2 = gather_pages(np.ascontiguousarray(pages.transpose(0, 1, 3, 2, 4)), indptr, idx, last, "HND")
    assert all(np.array_equal(a, b) for a, b in zip(k, k2))
