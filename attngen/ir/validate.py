"""Checks that a Variant is well formed: identifiers, hook signatures, dtypes, purity.

Each check raises :class:`VariantError` naming the variant, the hook, the source
line and the fix. Nothing here looks at targets or templates.
"""
from __future__ import annotations

import keyword
import re

import tvm
import tvm.tirx as tir

from . import tir_utils as tu
from .declarations import ScalarParam, StateAlgebra, TensorParam, scalar_value
from .errors import VariantError
from .hook_calls import check_calls
from .hook_spec import HOOKS, ROW_ARGS, SOFTMAX_ONLY, STANDARD_SCALARS, HookSpec
from .int_arithmetic import check_position_arithmetic, parameter_problem
from .row_hook_checks import check_row_hook
from .tensor_reads import TensorReads, check_hook_shapes, check_tensor_reads

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_C_KEYWORDS = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef union
    unsigned void volatile while bool class namespace template typename this new delete operator
    private protected public virtual friend true false nullptr using constexpr static_assert
    decltype noexcept thread_local alignas alignof char16_t char32_t explicit mutable export
    try catch throw""".split()
)
# an extra parameter of one of these names would shadow it: the standard arguments and sm_scale, the
# arguments the generated C++ passes beside the parameters (set_params' entry and Params& p), the functions
# the lowered CUDA hooks call for T.min / T.max, and the C math headers' macros
_RESERVED = STANDARD_SCALARS | {"sm_scale", "p", "entry", "min", "max", "NAN", "INFINITY"}
_PARAM_DTYPES = frozenset({"float32", "int32", "int64", "uint8", "float16", "bfloat16"})
# scalar dtypes the CPU backend cannot take through TVM-FFI (it has no bfloat16 scalars)
_TENSOR_ONLY_DTYPES = frozenset({"bfloat16"})
MAX_NAME_LENGTH = 128  # a variant's name is part of its files' names (lib<name>_cuda.so, hooks_<name>_...)


def check_identifier(kind: str, value: str, variant: str) -> None:
    """Reject names that are not safe C identifiers before they reach generated code."""
    if not isinstance(value, str) or not _IDENT.match(value) or value.startswith("__") \
            or value in _C_KEYWORDS or keyword.iskeyword(value):
        raise VariantError(
            variant if isinstance(variant, str) and _IDENT.match(variant) else f"<invalid name {variant!r}>",
            None,
            f"{kind} {value!r} is not a valid C identifier",
            "use letters, digits and '_' only, start with a letter, avoid C/C++/Python keywords "
            "and a leading '__'",
        )


def check_name_length(name: str) -> None:
    """A variant's name names its files, which file systems keep below 256 bytes."""
    if len(name) > MAX_NAME_LENGTH:
        raise VariantError(f"{name[:24]}...", None, f"variant name of {len(name)} characters is too long; it is "
                           "part of the names of the variant's files and symbols",
                           f"use a name of at most {MAX_NAME_LENGTH} characters")


def check_hook_names(variant: str, names) -> None:
    """Every hook keyword must name a kind in ``HOOKS``."""
    unknown = [n for n in names if n not in HOOKS]
    if unknown:
        raise VariantError(variant, None, f"unknown hook(s) {unknown}",
                           f"hooks are {list(HOOKS)}; declare extra parameters in params=[...]")


def check_params_argument(variant: str, params) -> None:
    """``params`` is a list of parameters, not one parameter or a name."""
    if isinstance(params, (ScalarParam, TensorParam, str, bytes)) or not hasattr(params, "__iter__"):
        shown = f"{type(params).__name__} {params!r}"
        raise VariantError(variant, None, f"params={shown[:80]} is not a list of parameters",
                           "pass a list, e.g. params=[ScalarParam('soft_cap', 'float32', 30.0)]")


def validate_variant(v) -> None:
    """Every check of a constructed Variant ``v`` (its name, params, state and hooks)."""
    check_identifier("variant name", v.name, v.name)
    check_name_length(v.name)
    try:
        StateAlgebra(v.state)
    except ValueError:
        raise VariantError(v.name, None, f"unknown state algebra {v.state!r}",
                           "use state='softmax' or state='sum'") from None
    seen = set()
    for p in v.params:
        _check_param(v, p, seen)
        seen.add(p.name)
    _check_size_member_names(v)
    for name, func in v.hooks.items():
        _check_hook(v, HOOKS[name], func)
        if v.state == StateAlgebra.SUM:
            _check_no_softmax_args(v, HOOKS[name], func)
    reads = TensorReads(v)
    check_hook_shapes(v, reads)  # sizes the hooks' buffers fix against the declarations and each other
    check_tensor_reads(v, reads)  # reads of tensor parameters that no call could bound
    _check_defaults(v)


def _check_defaults(v) -> None:
    """A scalar parameter's default that every call leaving it out would be refused for (int_arithmetic.py)."""
    defaults = {p.name: scalar_value(p.dtype, p.default)[0] for p in v.params
                if isinstance(p, ScalarParam) and p.default is not None}
    bad = parameter_problem(v, defaults) if defaults else None
    if bad:
        raise VariantError(v.name, None, f"the default of parameter '{bad[0]}': {bad[1]}", f"declare {bad[2]}")


def _check_param(v, p, seen: set) -> None:
    """One extra parameter's declaration: its kind, name and dtype."""
    if not isinstance(p, (ScalarParam, TensorParam)):
        raise VariantError(v.name, None, f"parameter {p!r} is not a ScalarParam or TensorParam",
                           "declare extra parameters as ScalarParam(name, dtype) or TensorParam(name, dtype)")
    check_identifier("parameter name", p.name, v.name)
    if p.name in _RESERVED or p.name in seen:
        raise VariantError(v.name, None, f"parameter name {p.name!r} is reserved or declared twice",
                           f"rename it; reserved names are {sorted(_RESERVED)}")
    if p.dtype not in _PARAM_DTYPES:
        raise VariantError(v.name, None, f"parameter {p.name!r} has unsupported dtype {p.dtype!r}",
                           f"use one of {sorted(_PARAM_DTYPES)}")
    if isinstance(p, ScalarParam) and p.dtype in _TENSOR_ONLY_DTYPES:
        raise VariantError(v.name, None, f"scalar parameter {p.name!r} is {p.dtype}, which the CPU backend cannot "
                           f"take as a scalar (TVM-FFI passes no {p.dtype} scalars)",
                           f"declare it ScalarParam('{p.name}', 'float32') and round it in the hook with "
                           f"T.Cast('{p.dtype}', {p.name}): the value the kernel sees is the same")


def _check_size_member_names(v) -> None:
    """No parameter takes the name ``<tensor>_dim<i>`` that the generated code gives a tensor's sizes."""
    for t in v.tensor_params:
        taken = [p.name for p in v.params if re.fullmatch(rf"{re.escape(t.name)}_dim\d+", p.name)]
        if taken:
            raise VariantError(v.name, None, f"parameter name {taken[0]!r} is the name the generated code gives "
                               f"a size of tensor parameter '{t.name}'", f"rename '{taken[0]}'")


def _check_no_softmax_args(v, spec: HookSpec, func) -> None:
    used = {p.name for p in tu.used_vars(func.body)}
    for arg in SOFTMAX_ONLY:
        if arg in spec.scalar_names and arg in used:
            raise VariantError(v.name, spec.name, f"a sum-state variant has no {arg} to read",
                               f"drop the use of '{arg}' or use state='softmax'")


def _err(v, hook, problem, fix, node=None):
    where = tu.source_line(node) if node is not None else None
    return VariantError(v.name, hook, problem, fix, where)


def _check_hook(v, spec: HookSpec, func) -> None:
    if not isinstance(func, tir.PrimFunc):
        raise _err(v, spec.name, f"got {type(func).__name__}, not a TIR function",
                   "decorate the hook with @T.prim_func (from tvm.script import tirx as T)")
    params = list(func.params)
    n_rows = len(ROW_ARGS) if spec.row else 0
    n_std = spec.n_standard
    sig_fix = f"declare it as {spec.signature()}"
    if len(params) < n_std:
        raise _err(v, spec.name, f"takes {len(params)} parameters, the contract needs at least {n_std}",
                   sig_fix, func.body)
    for i in range(n_rows):
        p = params[i]
        if not tir.is_buffer_var(p):
            raise _err(v, spec.name, f"parameter {i} ({p.name}) must be a row buffer", sig_fix, func.body)
        if len(p.shape) != 1 or str(p.dtype) != "float32":
            raise _err(v, spec.name,
                       f"row buffer {p.name} is {str(p.dtype)}{list(p.shape)}, expected float32[d]",
                       "declare rows as 1-D float32 buffers of head_dim elements "
                       "(d = T.int32(); T.match_buffer(h, (d,), 'float32'))", func.body)
    for (want, dtype), p in zip(spec.scalars, params[n_rows:n_std]):
        if tir.is_buffer_var(p) or p.name != want or str(p.ty) != dtype:
            got = f"{p.name}: {tu.param_dtype(p)}" + (" buffer" if tir.is_buffer_var(p) else "")
            raise _err(v, spec.name, f"parameter {params.index(p)} is '{got}', expected '{want}: T.{dtype}'",
                       sig_fix, func.body)
    _check_return(v, spec, func, sig_fix)
    for p in params[n_std:]:
        _check_extra_param(v, spec, func, p)
    _check_purity(v, spec, func, params[:n_rows])
    check_calls(v.name, spec.name, func)
    check_position_arithmetic(v.name, spec.name, func)
    if spec.row:
        check_row_hook(v.name, spec.name, func)


def _check_return(v, spec, func, sig_fix):
    ret = func.ret_type
    ret_s = None if ret is None or isinstance(ret, tvm.ir.TupleType) or str(ret) == "void" else str(ret)
    if spec.returns is None:
        if ret_s is not None:
            raise _err(v, spec.name, f"returns {ret_s}; a row hook writes its output row instead",
                       "drop the return annotation and store into the second row buffer", func.body)
        return
    if ret_s != spec.returns:
        raise _err(v, spec.name, f"returns {ret_s or 'nothing'}, the contract needs {spec.returns}",
                   sig_fix if spec.returns != "bool" else
                   "annotate '-> T.bool' and return a comparison such as 'kv_pos <= qo_pos'", func.body)
    try:
        _, value = tu.strip_binds(func.body)
    except ValueError:
        raise _err(v, spec.name, "body is not a straight line of 'x: T.let = ...' bindings ending in 'return'",
                   "write branches as T.if_then_else(...) or T.Select(...) inside one return expression",
                   func.body) from None
    if str(value.ty) != spec.returns:
        raise _err(v, spec.name, f"returned expression has dtype {value.ty}, expected {spec.returns}",
                   "cast the result or return a comparison", func.body)


def _check_extra_param(v, spec, func, p) -> None:
    decl = v.param(p.name)
    if decl is None:
        declared = [q.name for q in v.params] or "none"
        raise _err(v, spec.name, f"parameter '{p.name}' is neither a standard argument nor a declared "
                   f"parameter (declared: {declared})",
                   f"add ScalarParam('{p.name}', ...) or TensorParam('{p.name}', ...) to the Variant's params, "
                   "or rename it to a declared one", func.body)
    is_buf = tir.is_buffer_var(p)
    if is_buf != isinstance(decl, TensorParam) or tu.param_dtype(p) != decl.dtype:
        kind = "tensor" if isinstance(decl, TensorParam) else "scalar"
        raise _err(v, spec.name, f"parameter '{p.name}' is {tu.param_dtype(p)}{' buffer' if is_buf else ''} "
                   f"but is declared as a {decl.dtype} {kind}",
                   "make the hook's parameter and the Variant's declaration agree", func.body)
    if is_buf and len(p.shape) != len(decl.shape):
        raise _err(v, spec.name, f"tensor parameter '{p.name}' has {len(p.shape)} dims, declared {len(decl.shape)}",
                   "make the hook's buffer rank match TensorParam.shape", func.body)


def _check_purity(v, spec, func, rows) -> None:
    out_row = rows[1] if rows else None
    for store in tu.collect(func.body, tir.BufferStore):
        if out_row is None or not store.buffer.same_as(out_row):
            target = store.buffer.name
            fix = ("a scalar hook must only return a value; use 'x: T.let = ...' for locals"
                   if out_row is None else f"store only into the output row '{out_row.name}'")
            raise _err(v, spec.name, f"stores into '{target}'", fix, store)
    for alloc in tu.collect(func.body, tir.AllocBuffer):
        raise _err(v, spec.name, f"allocates buffer '{alloc.buffer.name}'",
                   "use 'x: T.let = ...' for scalar locals; hooks may not allocate memory", alloc)
    for call in tu.collect(func.body, tvm.ir.Call):
        op = getattr(call, "op", None)
        if isinstance(op, tvm.ir.GlobalVar) or (hasattr(op, "name") and op.name in (
                "tirx.call_extern", "tirx.call_packed", "tirx.call_intrin")):
            raise _err(v, spec.name, f"calls {getattr(op, 'name', op)}, which may have side effects",
                       "use TIR math (T.exp, T.tanh, ...) and T.call_pure_extern for pure device functions",
                       func.body)
