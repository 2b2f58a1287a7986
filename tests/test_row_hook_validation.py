"""Row hooks checked at Variant construction: bounded loops, row accesses inside the row, the whole
output row written; and the legitimate hooks these checks must keep accepting."""
import pathlib
import runpy

import pytest
from tvm.script import tirx as T

from attngen import ScalarParam, TensorParam, Variant, VariantError
from attngen.ir.row_prover import ROW_LENGTH_MULTIPLE, RowProver
from attngen.variants import BUILTINS, builtin

from . import row_hook_variants

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


def refused(hook, **variant_kwargs) -> str:
    with pytest.raises(VariantError) as e:
        Variant("v", query_transform=hook, **variant_kwargs)
    msg = str(e.value)
    assert msg.startswith("variant 'v', hook 'query_transform' (")
    assert "test_row_hook_validation.py:" in msg and ". Fix: " in msg
    return msg


def line_of(text: str) -> str:
    """``file:line`` of the first line of this file that contains ``text``."""
    lines = pathlib.Path(__file__).read_text().splitlines()
    return f"test_row_hook_validation.py:{next(n for n, s in enumerate(lines, 1) if text in s)}"


# Loops


def test_while_loop_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i]
        while qo_pos > 0:  # never-ending-loop
            y[0] = x[0]

    msg = refused(q)
    assert "has a 'while' loop, whose number of iterations cannot be bounded" in msg
    assert line_of("# never-ending-loop") in msg
    assert "Fix: loop with 'for i in range(n)'" in msg


def test_loop_bounded_by_a_position_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i]
        for j in range(qo_pos):  # position-bound-loop
            y[0] = y[0] + T.float32(1)

    msg = refused(q)
    assert "loop 'j' runs qo_pos times, which is not bounded by the row length or a constant" in msg
    assert line_of("# position-bound-loop") in msg


def test_loop_bounded_by_row_data_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i]
        for j in range(T.Cast("int32", x[0])):
            y[0] = y[0] + T.float32(1)

    assert "loop 'j' runs T.Cast(\"int32\", x[0]) times" in refused(q)


def test_parallel_loop_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in T.parallel(d):
            y[i] = x[i]

    msg = refused(q)
    assert "loop 'i' is parallel; a hook runs its loops in order within one thread" in msg
    assert "Fix: use 'range(...)' or 'T.unroll(...)'" in msg


# Row accesses


def test_read_past_the_row_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i + 1]  # reads-one-past

    msg = refused(q)
    assert "reads x[i + 1], which may fall outside the row [0, d) (i in [0, d))" in msg
    assert line_of("# reads-one-past") in msg
    assert "Fix: keep every row index within [0, d)" in msg and "'(...) % d'" in msg


def test_read_before_the_row_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i] - x[i - 1]

    assert "reads x[i - 1], which may fall outside the row" in refused(q)


def test_store_past_the_row_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i]
        y[d] = T.float32(0)  # store-past-end

    msg = refused(q)
    assert "stores y[d], which may fall outside the row [0, d)" in msg
    assert line_of("# store-past-end") in msg


def test_row_index_through_a_let_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            j: T.let = i + 1
            y[i] = x[j]

    assert "reads x[j] (= x[i + 1]), which may fall outside the row [0, d)" in refused(q)


def test_stepped_loop_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(0, d, 2):  # stepped-loop
            y[i] = -x[i + 1]
            y[i + 1] = x[i]

    msg = refused(q)
    assert "loop 'i' has step 2; hook loops take every value of their range" in msg
    assert line_of("# stepped-loop") in msg and "for i in range(d // 2): y[2 * i] = ..." in msg


def test_row_index_from_a_position_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[qo_pos]

    assert "reads x[qo_pos], which may fall outside the row" in refused(q)


def test_select_does_not_guard_its_operands():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = T.Select(i < d // 2, x[i + d // 2], x[i - d // 2])

    msg = refused(q)
    assert "reads x[i + d // 2], which may fall outside the row" in msg
    assert "T.Select evaluates both of its operands" in msg


def test_rows_of_different_fixed_lengths_are_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        x = T.match_buffer(x_ptr, (64,), "float32")
        y = T.match_buffer(y_ptr, (32,), "float32")
        for i in range(32):
            y[i] = x[i]

    assert "the rows have fixed lengths 64 and 32" in refused(q)


# The whole output row


def test_half_written_row_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d // 2):
            y[i] = x[i]

    msg = refused(q)
    assert "may leave elements [d // 2, d) of the output row 'y' unwritten" in msg
    assert "Fix: store every element of 'y' on every path" in msg


def test_fixed_length_row_missing_its_last_element_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        x = T.match_buffer(x_ptr, (64,), "float32")
        y = T.match_buffer(y_ptr, (64,), "float32")
        for i in range(63):
            y[i] = x[i]

    assert "may leave elements [63, 64) of the output row 'y' unwritten" in refused(q)


def test_strided_stores_leave_gaps():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d // 2):
            y[2 * i] = x[2 * i]  # even-elements

    msg = refused(q)
    assert "may leave elements [0, d) of the output row 'y' unwritten" in msg
    assert "the store at " in msg and line_of("# even-elements") in msg
    assert "moves by 2 elements per iteration of loop 'i' but stores 1, leaving gaps" in msg


def test_store_at_a_non_linear_index_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[(2 * i) % d] = x[i]  # hits even elements twice, odd ones never

    assert "has an index that is not linear in loop variable 'i'" in refused(q)


def test_store_under_a_data_condition_without_else_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            if x[i] > T.float32(0):
                y[i] = x[i]

    msg = refused(q)
    assert "may leave elements [0, d) of the output row 'y' unwritten" in msg
    assert "runs only when 'x[i] > T.float32(0.0)', a condition on float values" in msg


def test_store_under_a_position_condition_without_else_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        if qo_pos >= 0:
            for i in range(d):
                y[i] = x[i]

    assert "runs only when 'qo_pos >= 0'" in refused(q)


def test_guarded_halves_that_miss_the_middle_are_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            if i < d // 2 - 1:
                y[i] = x[i]
        for i in range(d):
            if i >= d // 2:
                y[i] = x[i]

    assert "may leave elements [d // 2 - 1, d // 2) of the output row 'y' unwritten" in refused(q)


def test_separate_float_conditions_do_not_cover_the_row():
    # a NaN in x[0] makes both conditions false
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        if x[0] > T.float32(0):
            for i in range(d):
                y[i] = x[i]
        if x[0] <= T.float32(0):
            for i in range(d):
                y[i] = -x[i]

    assert "runs only when 'x[0] > T.float32(0.0)', a condition on float values" in refused(q)


def test_loop_that_may_not_run_writes_nothing_for_sure():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d - 32):  # no iteration at head_dim 32, where element 0 stays unwritten
            y[i] = x[i]
        for i in range(T.max(d - 32, 1), d):
            y[i] = x[i]

    msg = refused(q)
    assert "may leave elements [0, T.max(d - 32, 1)) of the output row 'y' unwritten" in msg
    assert "runs only when 'd - 32 >= 1'" in msg


def test_reading_the_output_row_before_storing_it_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = y[i] + x[i]  # accumulates-into-undefined

    msg = refused(q)
    assert "reads y[i] before the hook has surely stored it (the output row starts out undefined" in msg
    assert line_of("# accumulates-into-undefined") in msg
    assert "Fix: store the element first" in msg


def test_reduction_without_initial_store_is_refused():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(1, d):
            y[i] = x[i]
        for j in range(d):
            y[0] = y[0] + x[j] * x[j]

    assert "reads y[0] before the hook has surely stored it" in refused(q)


def test_loop_that_may_break_counts_for_nothing():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i]
            if x[i] > T.float32(100):
                T.break_loop()

    assert "sits in loop 'i', which may exit early" in refused(q)


# Legitimate hooks stay accepted


def accepted(hook, **variant_kwargs) -> Variant:
    return Variant("ok", query_transform=hook, **variant_kwargs)


def test_elementwise_map_is_accepted():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32, scale: T.float32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i] * scale

    accepted(q, params=[ScalarParam("scale")])


def test_rotate_half_by_modulo_is_accepted():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i] + x[(i + d // 2) % d]

    accepted(q)


def test_rotate_half_by_if_then_else_is_accepted():
    # the access on each side of T.if_then_else is in the row only under its condition
    accepted(builtin("rope").hooks["query_transform"], params=builtin("rope").params)


def test_reduction_over_the_row_is_accepted():
    @T.prim_func
    def rms_norm(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        y[0] = T.float32(0)
        for j in range(d):
            y[0] = y[0] + x[j] * x[j]
        for i in range(1, d):
            y[i] = x[i] * T.rsqrt(y[0] / T.float32(d) + T.float32(1e-6))
        y[0] = x[0] * T.rsqrt(y[0] / T.float32(d) + T.float32(1e-6))

    accepted(rms_norm)


def test_if_guarded_stores_that_cover_the_row_are_accepted():
    @T.prim_func
    def two_loops(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            if i < d // 2:
                y[i] = -x[i + d // 2]
        for i in range(d):
            if i >= d // 2:
                y[i] = x[i - d // 2]

    @T.prim_func
    def if_else(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            if x[i] > T.float32(0):
                y[i] = x[i]
            else:
                y[i] = T.float32(0)

    @T.prim_func
    def by_position(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        if qo_pos >= 0:
            for i in range(d):
                y[i] = x[i]
        else:
            for i in range(d // 2):
                y[i] = T.float32(0)
            for i in range(d // 2, d):
                y[i] = x[i]

    @T.prim_func
    def empty_first_loop(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d - 64):  # no iteration at head_dim 32 or 64, where the second loop covers the row
            y[i] = x[i]
        for i in range(T.max(d - 64, 0), d):
            y[i] = x[i]

    for hook in (two_loops, if_else, by_position, empty_first_loop):
        accepted(hook)


def test_interleaved_pairs_and_rotated_stores_are_accepted():
    @T.prim_func
    def gptj_rotate(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d // 2):
            y[2 * i] = -x[2 * i + 1]
            y[2 * i + 1] = x[2 * i]

    @T.prim_func
    def rotated_store(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[(i + d // 2) % d] = x[i]

    for hook in (gptj_rotate, rotated_store):
        accepted(hook)


def test_tiled_reversed_and_bounded_loops_are_accepted():
    @T.prim_func
    def tiles(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for t in range(d // 4):
            for j in T.unroll(4):
                y[4 * t + j] = x[4 * t + j]

    @T.prim_func
    def reverse(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            j: T.let = d - 1 - i
            y[j] = x[i]

    @T.prim_func
    def partial(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32, rot: T.int32):
        d = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        for i in range(d):
            y[i] = x[i]
        for i in range(T.min(rot, d)):  # bounded by d whatever rot is
            y[i] = y[i] * T.float32(2)

    for hook in (tiles, reverse):
        accepted(hook)
    accepted(partial, params=[ScalarParam("rot", "int32", 32)])


def test_tensor_parameter_indices_are_left_to_run_time_checks():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32, t_ptr: T.handle):
        d = T.int32()
        n = T.int32()
        x = T.match_buffer(x_ptr, (d,), "float32")
        y = T.match_buffer(y_ptr, (d,), "float32")
        t = T.match_buffer(t_ptr, (n,), "float32")
        for i in range(d):
            y[i] = x[i] * t[qo_pos * d + i]

    # a position-indexed read needs a declared length (the tensor-read rule); the row checks leave it alone
    accepted(q, params=[TensorParam("t", "float32", ("n>=4096",))])


def test_fixed_length_rows_are_accepted():
    @T.prim_func
    def q(x_ptr: T.handle, y_ptr: T.handle, qo_pos: T.int32, qo_head: T.int32):
        x = T.match_buffer(x_ptr, (64,), "float32")
        y = T.match_buffer(y_ptr, (64,), "float32")
        for i in range(64):
            y[i] = x[63 - i]

    accepted(q)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_variants_are_accepted(name):
    assert builtin(name).name == name


VARIANT_EXAMPLES = [p for p in EXAMPLES if "\nvariant = " in p.read_text()]  # the examples that define one


@pytest.mark.parametrize("path", VARIANT_EXAMPLES, ids=[p.stem for p in VARIANT_EXAMPLES])
def test_example_variants_are_accepted(path):
    assert isinstance(runpy.run_path(str(path))["variant"], Variant)  # constructing it runs the checks


def test_whole_row_test_variants_are_accepted():
    assert set(row_hook_variants.make().hooks) == {"query_transform", "key_transform", "output_transform"}


def test_head_dims_are_multiples_of_the_assumed_row_length_multiple():
    """The checks prove claims for every row length that is a multiple of ROW_LENGTH_MULTIPLE."""
    from attngen.schedules.build_config import HEAD_DIMS_CPU
    from attngen.schedules.registry import TEMPLATES

    dims = set(HEAD_DIMS_CPU) | {d for r in TEMPLATES.values() for d in r.head_dims}
    assert all(d % ROW_LENGTH_MULTIPLE == 0 and d >= ROW_LENGTH_MULTIPLE for d in dims), sorted(dims)


def test_the_prover_has_z3():
    """Claims such as 'i + d // 2 < d when i < d // 2' need TVM's Z3 fallback; without it, RoPE is refused."""
    assert RowProver().analyzer.is_z3_enabled
