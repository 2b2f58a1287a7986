"""Every validation error of a malformed variant, with its message."""
import pytest
from tvm.script import tirx as T

from attngen import ScalarParam, TensorParam, Variant, VariantError


@T.prim_func
def softcap(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
            kv_head: T.int32, cap: T.float32) -> T.float32:
    return cap * T.tanh(s / cap)


def test_valid_variant_builds():
    v = Variant("softcap", logits_transform=softcap, params=[ScalarParam("cap")])
    assert v.hooks == {"logits_transform": softcap}
    assert len(v.fingerprint) == 16


def test_wrong_signature_order():
    @T.prim_func
    def swapped(s: T.float32, batch: T.int32, kv_pos: T.int32, qo_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32) -> T.float32:
        return s

    with pytest.raises(VariantError) as e:
        Variant("v", logits_transform=swapped)
    msg = str(e.value)
    assert "variant 'v', hook 'logits_transform'" in msg
    assert "parameter 2 is 'kv_pos: int32', expected 'qo_pos: T.int32'" in msg
    assert "test_validation.py:" in msg  # the source line of the hook
    assert "Fix: declare it as def logits_transform(s: T.float32, batch: T.int32" in msg


def test_too_few_parameters():
    @T.prim_func
    def short(batch: T.int32, qo_pos: T.int32) -> T.bool:
        return qo_pos >= 0

    with pytest.raises(VariantError, match=r"takes 2 parameters, the contract needs at least 5"):
        Variant("v", logits_mask=short)


def test_wrong_dtype_of_standard_argument():
    @T.prim_func
    def f(s: T.float16, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32) -> T.float32:
        return T.Cast("float32", s)

    with pytest.raises(VariantError, match=r"parameter 0 is 's: float16', expected 's: T.float32'"):
        Variant("v", logits_transform=f)


def test_wrong_return_dtype():
    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32) -> T.float16:
        return T.Cast("float16", s)

    with pytest.raises(VariantError, match=r"returns float16, the contract needs float32"):
        Variant("v", logits_transform=f)


def test_mask_returning_non_bool():
    @T.prim_func
    def m(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32) -> T.int32:
        return qo_pos - kv_pos

    with pytest.raises(VariantError) as e:
        Variant("v", logits_mask=m)
    assert "returns int32, the contract needs bool" in str(e.value)
    assert "annotate '-> T.bool'" in str(e.value)


def test_row_hook_with_wrong_row_dtype():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float16")
        y = T.match_buffer(y_ptr, (d,), "float16")
        for i in range(d):
            y[i] = x[i]

    with pytest.raises(VariantError, match=r"row buffer x is float16\[d\], expected float32\[d\]"):
        Variant("v", query_transform=q)


def test_store_into_input_row():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            x[i] = T.float32(0)
            y[i] = x[i]

    with pytest.raises(VariantError) as e:
        Variant("v", query_transform=q)
    assert "stores into 'x'" in str(e.value)
    assert "store only into the output row 'y'" in str(e.value)
    assert "test_validation.py:" in str(e.value)


def test_store_into_parameter_tensor_from_scalar_hook():
    @T.prim_func
    def o(x_ptr: T.handle, y_ptr: T.handle, batch: T.int32, qo_pos: T.int32, qo_head: T.int32,
          lse: T.float32, t_ptr: T.handle):
        d = T.int32()
        n = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        table = T.match_buffer(t_ptr, (n,), "float32")
        for i in range(d):
            table[0] = lse
            y[i] = x[i]

    with pytest.raises(VariantError, match=r"stores into 'table'"):
        Variant("v", output_transform=o, params=[TensorParam("table", "float32")])


def test_unknown_parameter():
    with pytest.raises(VariantError) as e:
        Variant("v", logits_transform=softcap)
    assert "parameter 'cap' is neither a standard argument nor a declared parameter" in str(e.value)
    assert "add ScalarParam('cap', ...)" in str(e.value)


def test_parameter_kind_mismatch():
    with pytest.raises(VariantError, match=r"parameter 'cap' is float32 but is declared as a float32 tensor"):
        Variant("v", logits_transform=softcap, params=[TensorParam("cap", "float32")])


@pytest.mark.parametrize("name", ["bad-name", "1abc", "int", "__x", "a b", "", "return"])
def test_bad_variant_identifier(name):
    with pytest.raises(VariantError, match=r"is not a valid C identifier"):
        Variant(name)


@pytest.mark.parametrize("name", ["cap;", "x y", "class"])
def test_bad_parameter_identifier(name):
    with pytest.raises(VariantError, match=r"parameter name .* is not a valid C identifier"):
        Variant("v", params=[ScalarParam(name)])


def test_reserved_and_duplicate_parameter_names():
    with pytest.raises(VariantError, match=r"reserved or declared twice"):
        Variant("v", params=[ScalarParam("sm_scale")])
    with pytest.raises(VariantError, match=r"reserved or declared twice"):
        Variant("v", params=[ScalarParam("a"), ScalarParam("a")])


def test_not_a_prim_func():
    with pytest.raises(VariantError, match=r"not a TIR function.*@T.prim_func"):
        Variant("v", logits_transform=lambda s: s)


def test_scalar_hook_with_branches_is_rejected():
    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32) -> T.float32:
        if s > T.float32(0):
            return s
        return -s

    with pytest.raises(VariantError, match=r"not a straight line"):
        Variant("v", logits_transform=f)


def test_unknown_state_algebra():
    with pytest.raises(VariantError, match=r"unknown state algebra 'max'"):
        Variant("v", state="max")


def test_sum_variant_cannot_read_lse():
    @T.prim_func
    def o(x_ptr: T.handle, y_ptr: T.handle, batch: T.int32, qo_pos: T.int32, qo_head: T.int32,
          lse: T.float32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i] * lse

    with pytest.raises(VariantError, match=r"sum-state variant has no lse"):
        Variant("v", output_transform=o, state="sum")


def test_unknown_hook_keyword():
    with pytest.raises(VariantError) as e:
        Variant("v", logit_transform=softcap, params=[ScalarParam("cap")])
    assert "unknown hook(s) ['logit_transform']" in str(e.value)
    assert "hooks are ['query_transform', 'key_transform', 'logits_transform'" in str(e.value)


def test_constructor_takes_one_keyword_per_hook_kind():
    import inspect

    from attngen.ir import HOOK_ORDER

    keywords = inspect.signature(Variant).parameters
    assert all(keywords[h].kind is inspect.Parameter.KEYWORD_ONLY for h in HOOK_ORDER)
