"""Mistakes a new user makes, each met with a clear error before anything runs (CPU; the CUDA runtime
shares ``resolve_params``): tensor parameters of the wrong size, scalar parameters outside their dtype,
2-D tensor parameters on CUDA, typos in hooks."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tvm.script import tirx as T

from attngen import ConfigError, ScalarParam, TensorParam, Variant, VariantError
from attngen.cli import main
from attngen.codegen.cuda_variant import traits_source
from attngen.codegen.hooks_cuda import lower_hooks_cuda
from attngen.ir.tensor_reads import TensorReads, check_tensor_reads
from attngen.runtime import AttentionArgumentError, CPUAttention
from attngen.runtime.params import resolve_params
from attngen.testing import check_cpu_variant, random_problem
from attngen.variants import builtin

D = 32


@T.prim_func
def row_bias(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
             kv_head: T.int32, bias_ptr: T.handle, scale: T.int32) -> T.float32:
    rows = T.int32()
    heads = T.int32()
    bias = T.match_buffer(bias_ptr, (rows, heads), "float32")
    return s + bias[batch, qo_head] * T.Cast("float32", scale)


def bias_variant(shape=("rows", "num_qo_heads")) -> Variant:
    """A 2-D table read by (request, query head), its first dim symbolic, and an int32 scalar."""
    return Variant("row_bias", logits_transform=row_bias,
                   params=[TensorParam("bias", "float32", shape), ScalarParam("scale", "int32", 1)])


@pytest.fixture(scope="module")
def att(build_cache):
    return CPUAttention.build(bias_variant(), head_dims=(D,), layouts=("NHD",), cache=build_cache)


@pytest.fixture
def prob(rng):
    return random_problem(rng, [3, 2, 1], [5, 6, 4], 4, 2, D)


# --- tensor parameters: every dim checked --------------------------------------------------------------

def test_short_symbolic_dim_read_by_batch_is_refused(att, prob):
    """bias has 2 rows, the batch 3 requests: the hook would read row 2 past the end."""
    short = np.zeros((2, 4), np.float32)
    with pytest.raises(AttentionArgumentError,
                       match=r"params\['bias'\]: dim 0 has 2 entries, but hook 'logits_transform' "
                             r"\(.*test_bad_input.py:\d+\) reads index batch = 2 \(with batch_size=3\): "
                             r"it needs at least 3 entries"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"bias": short})
    with pytest.raises(AttentionArgumentError, match=r"params\['bias'\]: dim 0 has 2 entries"):
        att.decode(prob.q[:3], prob.paged, params={"bias": short})


def test_two_dim_tensor_parameter_on_cpu_matches_the_reference(att, rng):
    res = check_cpu_variant(att, bias_variant(), rng, qo_lens=[3, 2, 1], kv_lens=[5, 6, 4], num_qo_heads=4,
                            num_kv_heads=2, head_dim=D, layouts=("NHD",))
    assert set(res) == {"prefill_paged_NHD", "prefill_ragged", "decode_paged_NHD"}
    longer = np.ones((7, 4), np.float32)  # more rows than requests is fine: the dim is symbolic
    prob = random_problem(rng, [3, 2, 1], [5, 6, 4], 4, 2, D)
    out, _ = att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"bias": longer})
    assert np.isfinite(out).all()


def test_named_dims_must_match_the_call(att, prob):
    with pytest.raises(AttentionArgumentError, match=r"params\['bias'\]: dim 1 \(num_qo_heads\) is 3, expected 4"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"bias": np.zeros((3, 3), np.float32)})


def _resolve(variant, params, **sizes):
    sizes = {"num_qo_heads": 4, "batch_size": 3, **sizes}
    return resolve_params(variant, params, **sizes)


def test_every_declared_dim_kind():
    fixed = bias_variant(("rows", 4))
    with pytest.raises(AttentionArgumentError, match=r"dim 1 \(4\) is 5, expected 4"):
        _resolve(fixed, {"bias": np.zeros((3, 5), np.float32)})
    bounded = bias_variant(("rows>=8", "num_qo_heads"))
    with pytest.raises(AttentionArgumentError, match=r"dim 0 \(rows>=8\) is 3, must be at least 8"):
        _resolve(bounded, {"bias": np.zeros((3, 4), np.float32)})
    assert len(_resolve(bounded, {"bias": np.zeros((8, 4), np.float32)})) == 2
    kv = bias_variant(("rows", "num_kv_heads"))
    with pytest.raises(AttentionArgumentError, match=r"dim 1 \(num_kv_heads\) is 4, expected 2"):
        _resolve(kv, {"bias": np.zeros((3, 4), np.float32)}, num_kv_heads=2)
    with pytest.raises(AttentionArgumentError, match=r"does not know num_kv_heads"):
        _resolve(kv, {"bias": np.zeros((3, 4), np.float32)})  # an entry that cannot check is no pass


@T.prim_func
def by_kv_head(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
               kv_head: T.int32, t_ptr: T.handle, offset: T.int32) -> T.float32:
    n = T.int32()
    table = T.match_buffer(t_ptr, (n,), "float32")
    return s + table[kv_head + offset]


def test_symbolic_dim_resolved_from_the_hooks_reads():
    v = Variant("kvt", logits_transform=by_kv_head,
                params=[TensorParam("table", "float32", ("n",)), ScalarParam("offset", "int32", 0)])
    ok = np.zeros(2, np.float32)
    assert len(_resolve(v, {"table": ok}, num_kv_heads=2)) == 2
    with pytest.raises(AttentionArgumentError, match=r"reads index kv_head \+ offset = 2 \(with num_kv_heads=2, offset=1\): "
                                                     r"it needs at least 3 entries"):
        _resolve(v, {"table": ok, "offset": 1}, num_kv_heads=2)
    with pytest.raises(AttentionArgumentError, match=r"reads index kv_head \+ offset = -1 .*needs indices from 0"):
        _resolve(v, {"table": ok, "offset": -1}, num_kv_heads=2)
    with pytest.raises(AttentionArgumentError, match=r"depends on \['num_kv_heads'\], which this entry point "
                                                     r"does not know"):
        _resolve(v, {"table": ok})


@T.prim_func
def by_position(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32, t_ptr: T.handle) -> T.float32:
    n = T.int32()
    table = T.match_buffer(t_ptr, (n,), "float32")
    return s + table[qo_pos - kv_pos]


@T.prim_func
def by_clamped_position(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                        kv_head: T.int32, t_ptr: T.handle) -> T.float32:
    n = T.int32()
    table = T.match_buffer(t_ptr, (n,), "float32")
    return s + table[T.min(T.max(qo_pos - kv_pos, 0), n - 1)]


def test_unboundable_read_of_a_plain_symbolic_dim_is_refused():
    with pytest.raises(VariantError, match=r"variant 'pos', hook 'logits_transform' \(.*test_bad_input.py:\d+\): "
                                           r"reads tensor parameter 'table' along dim 0 \('n'\) at an index "
                                           r"attngen cannot bound .*Fix: clamp the index"):
        Variant("pos", logits_transform=by_position, params=[TensorParam("table", "float32", ("n",))])
    # the fixes: a size declared by the variant, or a clamp with the buffer's size
    for shape in [(4096,), ("n>=4096",)]:
        check_tensor_reads(Variant("pos", logits_transform=by_position,
                                   params=[TensorParam("table", "float32", shape)]))
    clamped = Variant("pos", logits_transform=by_clamped_position, params=[TensorParam("table", "float32")])
    check_tensor_reads(clamped)
    assert len(_resolve(clamped, {"table": np.zeros(1, np.float32)})) == 1


def test_a_sized_dim_read_along_one_position_is_checked_against_the_longest_request(build_cache, rng):
    """A document id per position, ("batch_size", "max_len>=1"): the declaration alone admits one column; the
    call knows its longest KV length on the host and refuses a row shorter than it, by name, before any kernel
    (CPU prefill and decode; the CUDA plans pass the same length). A relation of two positions (qo_pos - kv_pos)
    stays with its declaration: the mask may bound it more than the positions' ranges."""
    import runpy
    from pathlib import Path

    docs = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "document_mask.py"))["variant"]
    ids = np.zeros((3, 6), np.int32)
    assert len(_resolve(docs, {"doc_ids": ids})) == 1  # positions unknown: the declaration (>= 1) holds
    assert len(_resolve(docs, {"doc_ids": ids}, positions=6)) == 1
    with pytest.raises(AttentionArgumentError, match=r"params\['doc_ids'\]: dim 1 has 6 entries, but hook "
                                                     r"'logits_mask' \(.*document_mask.py:\d+\) reads index "
                                                     r"(kv|qo)_pos = 6 \(with positions below 7, the batch's longest "
                                                     r"KV length\): it needs at least 7 entries"):
        _resolve(docs, {"doc_ids": ids}, positions=7)
    assert len(_resolve(docs, {"doc_ids": ids}, positions=lambda: 6)) == 1  # (a function: asked only if needed)
    relative = Variant("pos", logits_transform=by_position, params=[TensorParam("table", "float32", ("n>=4",))])
    assert len(_resolve(relative, {"table": np.zeros(4, np.float32)}, positions=100)) == 1

    att = CPUAttention.build(docs, head_dims=(D,), layouts=("NHD",), cache=build_cache)
    prob = random_problem(rng, [3, 2, 1], [5, 9, 4], 4, 2, D)
    with pytest.raises(AttentionArgumentError, match=r"params\['doc_ids'\]: dim 1 has 8 entries.*it needs at "
                                                     r"least 9 entries"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"doc_ids": np.zeros((3, 8), np.int32)})
    with pytest.raises(AttentionArgumentError, match=r"params\['doc_ids'\]: dim 1 has 8 entries"):
        att.decode(prob.q[:3], prob.paged, params={"doc_ids": np.zeros((3, 8), np.int32)})
    out, _ = att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"doc_ids": np.zeros((3, 9), np.int32)})
    assert np.isfinite(out).all()


def test_builtins_follow_the_rule():
    for name in ["alibi", "attention_sink", "custom_mask"]:
        check_tensor_reads(builtin(name))  # custom_mask's bit index comes from its offsets: data-bounded
    reads = TensorReads(builtin("custom_mask"))
    assert {(r.param, r.data_indexed) for r in reads.reads} == {
        ("mask_offset", False), ("mask_stride", False), ("mask_bits", True)}


@T.prim_func
def fixed_width(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                kv_head: T.int32, t_ptr: T.handle) -> T.float32:
    n = T.int32()
    table = T.match_buffer(t_ptr, (n, 4), "float32")
    return s + table[batch, 0]


def test_hook_buffer_shape_must_agree_with_the_tensor():
    v = Variant("fw", logits_transform=fixed_width, params=[TensorParam("table", "float32", ("n", "k"))])
    with pytest.raises(AttentionArgumentError, match=r"hook 'logits_transform' declares table dim 1 as 4, "
                                                     r"the tensor has 5"):
        _resolve(v, {"table": np.zeros((3, 5), np.float32)})


@pytest.mark.parametrize("shape, problem", [
    ("n", r"must be a tuple of dims"),
    ((), r"at least one dim"),
    ((0,), r"dim 0 must be at least 1"),
    (("n>=m",), r"'n>=m' is not a number, a name, or 'name>=B'"),
    (("2n",), r"'2n' is not a number"),
])
def test_tensor_param_declaration_grammar(shape, problem):
    with pytest.raises(ValueError, match=rf"TensorParam 't': .*{problem}"):
        TensorParam("t", "float32", shape)


# --- scalar parameters: range-checked against their dtype ----------------------------------------------

def test_int32_scalar_out_of_range_is_refused_at_the_call(att, prob):
    bias = np.zeros((3, 4), np.float32)
    with pytest.raises(AttentionArgumentError, match=r"params\['scale'\]: 2147483648 is outside int32's range "
                                                     r"\[-2147483648, 2147483647\]"):
        att.prefill(prob.q, prob.ragged, prob.qo_indptr, params={"bias": bias, "scale": 2**31})


def test_sliding_window_overflow_and_non_integers():
    v = builtin("sliding_window")
    with pytest.raises(AttentionArgumentError, match=r"params\['window_left'\]: 2147483648 is outside int32's "
                                                     r"range .*declares it int32"):
        _resolve(v, {"window_left": 2**31})
    with pytest.raises(AttentionArgumentError, match=r"params\['window_left'\]: 2.5 is not a whole number"):
        _resolve(v, {"window_left": 2.5})
    with pytest.raises(AttentionArgumentError, match=r"expected a whole number for int32, got str"):
        _resolve(v, {"window_left": "128"})
    assert _resolve(v, {"window_left": np.int64(128)}) == [128]
    assert _resolve(v, {"window_left": 128.0}) == [128]
    with pytest.raises(AttentionArgumentError, match=r"params\['soft_cap'\]: 1e\+39 overflows float32"):
        _resolve(builtin("logits_softcap"), {"soft_cap": 1e39})


def test_scalar_defaults_are_checked_when_declared():
    with pytest.raises(ValueError, match=r"ScalarParam 'window_left': default 2147483648 is outside int32's range"):
        ScalarParam("window_left", "int32", 2**31)
    with pytest.raises(ValueError, match=r"ScalarParam 'k': default 300 is outside uint8's range \[0, 255\]"):
        ScalarParam("k", "uint8", 300)
    with pytest.raises(ValueError, match=r"ScalarParam 'c': default 1e\+40 overflows float32"):
        ScalarParam("c", "float32", 1e40)


# --- 2-D tensor parameters on CUDA -------------------------------------------------------------------------

def test_two_dim_tensor_parameter_lowers_to_cuda():
    v = bias_variant()
    hs = lower_hooks_cuda(v, 64, "sm_80")
    assert hs.params[hs.symbol("logits_transform")] == ["bias", "bias_dim1", "scale"]
    assert hs.dims == {"bias_dim1": ("bias", 1)}
    assert "float* bias_ptr, int heads, int scale" in hs.code
    traits = traits_source(v, hs, 64)
    assert "    float* bias;\n    int bias_dim1;\n    int scale;" in traits
    assert "p.bias_dim1 = static_cast<int>(bias.size(1));" in traits
    assert "(s, batch, qo_pos, kv_pos, qo_head, kv_head, &r" not in traits
    assert ", p.bias, p.bias_dim1, p.scale, &r)" in traits


ROW_BIAS = textwrap.dedent("""\
    from tvm.script import tirx as T
    from attngen import TensorParam, Variant


    @T.prim_func
    def row_bias(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
                 kv_head: T.int32, bias_ptr: T.handle) -> T.float32:
        rows = T.int32()
        heads = T.int32()
        bias = T.match_buffer(bias_ptr, (rows, heads), "float32")
        return s + bias[batch, qo_head]


    variant = Variant("row_bias", logits_transform=row_bias,
                      params=[TensorParam("bias", "float32", ("batch_size", "num_qo_heads"))])
""")


def test_a_size_the_hook_computes_with_is_passed_on_cuda():
    v = Variant("clamp", logits_transform=by_clamped_position, params=[TensorParam("table", "float32")])
    hs = lower_hooks_cuda(v, 64, "sm_80")
    assert hs.dims == {"table_dim0": ("table", 0)}
    assert "float* table_ptr, int n, float* ret_ptr" in hs.code
    assert "p.table_dim0 = static_cast<int>(table.size(0));" in traits_source(v, hs, 64)
    alibi = lower_hooks_cuda(builtin("alibi"), 64, "sm_80")  # a 1-D read by head needs no size
    assert alibi.dims == {} and "int n" not in alibi.code


def test_inspect_shows_a_two_dim_tensor_variant(tmp_path, capsys):
    src = tmp_path / "row_bias.py"
    src.write_text(ROW_BIAS)
    assert main(["inspect", str(src), "--head-dim", "64"]) == 0
    assert "float* bias_ptr, int heads, float* ret_ptr" in capsys.readouterr().out


# --- TVM and TVMScript diagnostics ------------------------------------------------------------------------

TYPO = """\
from tvm.script import tirx as T
from attngen import ScalarParam, Variant


@T.prim_func
def softcap(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
            kv_head: T.int32, cap: T.float32) -> T.float32:
    return cap * T.tanhh(s / cap)


variant = Variant("typo", logits_transform=softcap, params=[ScalarParam("cap", "float32", 30.0)])
"""


@pytest.mark.parametrize("command", ["inspect", "build"])
def test_cli_prints_tvmscript_diagnostic_with_line_and_caret(tmp_path, capsys, command):
    src = tmp_path / "typo.py"
    src.write_text(TYPO)
    assert main([command, str(src)] + (["--cache-dir", str(tmp_path / "c")] if command == "build" else [])) == 2
    err = capsys.readouterr().err
    assert f"attngen: error: {src}: TVMScript could not parse a hook:" in err
    assert "has no attribute 'tanhh'" in err
    assert f"--> {src}:8:" in err
    assert "return cap * T.tanhh(s / cap)" in err and "^^^" in err


def test_script_defining_a_bad_hook_shows_the_diagnostic(tmp_path):
    """Python API: an uncaught diagnostic in a user's script prints TVM's text, not only TVM's note."""
    src = tmp_path / "typo.py"
    src.write_text("from attngen.loader import show_tvm_diagnostics\nshow_tvm_diagnostics()\n" + TYPO)
    run = subprocess.run([sys.executable, str(src)], capture_output=True, text=True, env=_env())
    assert run.returncode == 1
    assert "has no attribute 'tanhh'" in run.stderr and f"--> {src}:10:" in run.stderr and "^^^" in run.stderr


def _env():
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


FREE_VAR = textwrap.dedent("""\
    from tvm.script import tirx as T
    from attngen import Variant


    @T.prim_func(check_well_formed=False)
    def h(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32) -> T.float32:
        x = T.int32()
        return s + T.Cast("float32", x)


    variant = Variant("free_var", logits_transform=h)
""")


def test_cuda_lowering_failure_names_the_hook(tmp_path, capsys):
    src = tmp_path / "free_var.py"
    src.write_text(FREE_VAR)
    assert main(["inspect", str(src)]) == 2
    err = capsys.readouterr().err
    assert f"variant 'free_var', hook 'logits_transform' ({src}:" in err
    assert "TVM cannot lower it to CUDA (" in err and "undefined Variable x" in err
    assert "Traceback" not in err


@T.prim_func
def shifted(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
            shift: T.int32) -> T.float32:
    return s + T.Cast("float32", shift)


def test_tvm_slot_constants_are_range_checked_at_build_time():
    """Compiled into the TVM slots as literals, a constant outside its dtype is refused before any C++."""
    from attngen.codegen.cuda_tvm_slots import check_tvm_slot_variant

    v = Variant("shift", logits_transform=shifted, params=[ScalarParam("shift", "int32", 8)])
    check_tvm_slot_variant(v, {"shift": 2**31 - 1})
    with pytest.raises(ConfigError, match=r"tvm_constants\['shift'\] \(int32\): 2147483648 is outside int32"):
        check_tvm_slot_variant(v, {"shift": 2**31})


def test_tvm_slot_constants_become_exact_cxx_literals():
    """Values that pass the range check print as valid C++ (no 'inf', 'True' or NumPy reprs)."""
    from attngen.codegen.cuda_tvm_slots import cxx_literal

    assert cxx_literal("float32", 30.0) == (30.0).hex() and float.fromhex(cxx_literal("float32", 0.1)) == 0.1
    assert cxx_literal("float32", np.float32(0.5)) == (0.5).hex()
    assert cxx_literal("int32", True) == "1" and cxx_literal("int64", 2**40) == str(2**40)
    assert cxx_literal("float32", float("inf")) == "__builtin_inff()"
    assert cxx_literal("float32", float("-inf")) == "(-__builtin_inff())"
    assert cxx_literal("float32", float("nan")) == '__builtin_nanf("")'
    with pytest.raises(ConfigError, match="outside int32"):
        cxx_literal("int32", 2**31)
