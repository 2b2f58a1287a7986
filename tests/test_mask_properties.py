"""Property test: whatever mask expression is written, the classification is sound.

Random masks are built from linear position constraints, modular and head/batch
conditions combined with and/or/not. On a grid of positions, every visible key must
satisfy the claimed bounds on qo_pos - kv_pos, and the non-arbitrary classes must
describe the mask exactly.
"""
import numpy as np
import tvm
import tvm.tirx as tir
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.ir import MaskKind, classify_mask
from attngen.ir.tir_eval import eval_scalar_hook

NAMES = ("batch", "qo_pos", "kv_pos", "qo_head", "kv_head")


def _params():
    return [tir.Var(n, "int32") for n in NAMES]


def _atom(draw, p):
    batch, qo, kv, qh, _ = p
    c = draw(st.integers(-4, 4))
    kind = draw(st.sampled_from(["lin", "lin", "lin", "mod", "head", "batch"]))
    if kind == "lin":
        a, b = draw(st.sampled_from([(qo, kv), (kv, qo), (qo - kv, tir.IntImm("int32", 0)),
                                     (kv + c, qo), (qo, kv - c)]))
        op = draw(st.sampled_from([tir.LT, tir.LE, tir.GT, tir.GE, tir.EQ, tir.NE]))
        return op(a, b + c)
    if kind == "mod":
        return tir.EQ(tir.FloorMod(kv, tir.IntImm("int32", 3)), tir.IntImm("int32", abs(c) % 3))
    if kind == "head":
        return tir.LE(qh, tir.IntImm("int32", abs(c)))
    return tir.NE(batch, tir.IntImm("int32", abs(c)))


@st.composite
def masks(draw):
    p = _params()

    def expr(depth):
        if depth == 0 or draw(st.booleans()):
            return _atom(draw, p)
        op = draw(st.sampled_from(["and", "and", "or", "not"]))
        if op == "not":
            return tir.Not(expr(depth - 1))
        a, b = expr(depth - 1), expr(depth - 1)
        return tir.And(a, b) if op == "and" else tir.Or(a, b)

    body = tir.Return(expr(3))
    return tir.PrimFunc(p, body, tvm.ir.PrimType("bool"))


@settings(max_examples=150, deadline=None)
@given(masks())
def test_classification_is_sound(func):
    info = classify_mask(func, set())
    qo = np.arange(-3, 14)[:, None, None]
    kv = np.arange(-3, 14)[None, :, None]
    heads = np.arange(3)[None, None, :]
    visible = np.broadcast_to(eval_scalar_hook(func, [1, qo, kv, heads, heads], {}), (17, 17, 3))
    delta = np.broadcast_to(qo - kv, visible.shape)
    if info.lower is not None:
        assert np.all(delta[visible] >= int(info.lower.value)), info.describe()
    if info.upper is not None:
        assert np.all(delta[visible] <= int(info.upper.value)), info.describe()
    exact = {
        MaskKind.NONE: np.ones_like(visible),
        MaskKind.CAUSAL: delta >= 0,
        MaskKind.SLIDING_WINDOW: delta <= (int(info.upper.value) if info.upper is not None else 0),
        MaskKind.CAUSAL_WINDOW: (delta >= 0) & (delta <= (int(info.upper.value) if info.upper is not None else 0)),
    }
    if info.kind in exact:
        assert np.array_equal(visible, exact[info.kind]), info.describe()
