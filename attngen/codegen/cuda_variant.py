"""The C++ side of a variant: a traits struct the CUDA templates are instantiated with.

``struct Hooks_d<D>`` holds the variant's extra parameters (``Params``; a tensor as its pointer, plus
``int <tensor>_dim<i>`` for each of its sizes the lowered hooks take: ``HookSource.dims``) and how they
cross the FFI (``ExtraArgs``, ``set_params``: csrc/variant_params.h), compile-time flags (which hooks
exist, per-element forms, the state algebra, where sm_scale and log2 e are folded, the mask's
bounds) and forwarding functions to the hook device functions lowered by :mod:`.hooks_cuda`.
Absent hooks are identities (the table's ``identity``). The hook kinds come from the hook table
(``attngen.ir.HOOKS``): a row hook gets ``kHas<Name>``, ``k<CppName>Elementwise``, ``<cpp_name>_row``
and ``<cpp_name>_elem``, a scalar hook ``kHas<CppName>`` and ``<cpp_name>``, with the table's scalar
arguments.
"""
from __future__ import annotations

from attngen.ir import HOOKS, HookSpec, ScalarParam, StateAlgebra, TensorParam
from attngen.ir.mask_class import MaskKind

C_TYPES = {"float32": "float", "int32": "int", "int64": "int64_t", "uint8": "unsigned char",
           "float16": "half", "bfloat16": "__nv_bfloat16", "bool": "bool"}

_FN = "  __device__ __forceinline__ static"


def _dims_of(p, dims: dict) -> list[tuple[str, int]]:
    """(member, dim) of each size of tensor parameter ``p`` that the hooks take, in dim order."""
    return sorted(((m, i) for m, (t, i) in dims.items() if t == p.name), key=lambda x: x[1])


def params_struct(variant, dims: dict) -> str:
    fields = []
    for p in variant.params:
        ctype = C_TYPES[p.dtype] + ("*" if isinstance(p, TensorParam) else "")
        fields.append(f"    {ctype} {p.name};")
        fields += [f"    int {m};" for m, _ in _dims_of(p, dims)]
    return "  struct Params {\n" + ("\n".join(fields) or "    int unused;") + "\n  };\n"


def _ffi_type(p) -> str:
    """The C++ type a parameter arrives as through TVM-FFI."""
    if isinstance(p, TensorParam):
        return "tvm::ffi::TensorView"
    return "int64_t" if "int" in p.dtype else "double"


def _param_from_ffi(p, dims: dict) -> str:
    if isinstance(p, TensorParam):
        # the runtime checked each size against the declaration and the hooks' reads, so it fits an int
        sizes = "".join(f"\n    p.{m} = static_cast<int>({p.name}.size({i}));" for m, i in _dims_of(p, dims))
        return (f"    p.{p.name} = attngen::tensor_param<{C_TYPES[p.dtype]}>(entry, \"{p.name}\", {p.name}, "
                f"{len(p.shape)});" + sizes)
    assert isinstance(p, ScalarParam)
    return f"    p.{p.name} = static_cast<{C_TYPES[p.dtype] if 'int' in p.dtype else 'float'}>({p.name});"


def ffi_params(variant, dims: dict) -> str:
    """``ExtraArgs`` (the FFI types of the extra parameters, in declaration order, as the runtime's
    ``resolve_params`` passes them) and ``set_params`` (``entry``: the exported function, for errors)."""
    types = ", ".join(_ffi_type(p) for p in variant.params)
    decl = "".join(f", {_ffi_type(p)} {p.name}" for p in variant.params)
    body = "\n".join(_param_from_ffi(p, dims) for p in variant.params)
    return (f"  using ExtraArgs = attngen::ArgList<{types}>;\n"
            f"  static void set_params([[maybe_unused]] const char* entry, [[maybe_unused]] Params& p{decl}) {{\n"
            + (body + "\n" if body else "") + "  }\n")


def _b(x: bool) -> str:
    return "true" if x else "false"


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _scalar_args(spec: HookSpec) -> tuple[str, str]:
    """(C++ parameter list, argument list) of a hook's standard scalars, named as in the table."""
    return (", ".join(f"{C_TYPES[t]} {n}" for n, t in spec.scalars), ", ".join(n for n, _ in spec.scalars))


def _row_hook(spec: HookSpec, hooks, hs, head_dim: int, call) -> tuple[dict[str, str], list[str]]:
    """Flags and forwarding functions of one row hook: the whole-row form and the per-element form
    (a thread computing only its elements)."""
    short = spec.cpp_name
    flags = {f"kHas{_camel(spec.name)}": _b(spec.name in hooks),
             f"k{_camel(short)}Elementwise": _b(spec.name in hs.elementwise)}
    decl, args = _scalar_args(spec)
    if spec.name in hs.elementwise:
        body = f"float r; {call(hs.elementwise[spec.name], f'row, i, {args}')}, &r); return r;"
    else:
        body = "return row[i];"
    fns = [f"{_FN} float {short}_elem(const Params& p, float* row, int i, {decl}) {{ {body} }}"]
    if spec.name in hooks:
        body = f"{call(hs.symbol(spec.name), f'in, out, {args}')});"
    else:
        body = f"for (int i = 0; i < {head_dim}; ++i) out[i] = in[i];"
    fns.append(f"{_FN} void {short}_row(const Params& p, float* in, float* out, {decl}) {{ {body} }}")
    return flags, fns


def _scalar_hook(spec: HookSpec, hooks, hs, call) -> tuple[dict[str, str], list[str]]:
    """Flag and forwarding function of one scalar hook (its value comes back through a pointer)."""
    member, flag = spec.cpp_name, f"kHas{_camel(spec.cpp_name)}"
    identity = _b(spec.identity) if isinstance(spec.identity, bool) else spec.identity
    decl, args = _scalar_args(spec)
    ret = C_TYPES[spec.returns]
    if spec.name in hooks:
        body = f"{ret} r; {call(hs.symbol(spec.name), args)}, &r); return r;"
    else:
        body = f"return {identity};"
    return {flag: _b(spec.name in hooks)}, [f"{_FN} {ret} {member}(const Params& p, {decl}) {{ {body} }}"]


def traits_source(variant, hs, head_dim: int) -> str:
    """C++ source of ``attngen_gen::Hooks_d<head_dim>`` (after the hooks header)."""
    a = variant.analysis
    hooks = variant.hooks
    assert set(HOOKS) >= set(hooks)

    def call(sym, args):
        extra = "".join(f", p.{n}" for n in hs.params[sym])
        return f"{sym}({args}{extra}"

    flags = {
        "kSoftmax": _b(variant.state == StateAlgebra.SOFTMAX),
        "kQScaleLog2e": _b(a.scale.q_scale_log2e),
        "kLogitsLog2e": _b(a.scale.logits_log2e),
    }
    fns = []
    for spec in HOOKS.values():
        f, code = _row_hook(spec, hooks, hs, head_dim, call) if spec.row else _scalar_hook(spec, hooks, hs, call)
        flags.update(f)
        fns += code
    flags.update({
        "kHasLower": _b("lower" in hs.bounds),
        "kHasUpper": _b("upper" in hs.bounds),
        # the mask is exactly its bounds (causal, sliding window): a tile inside them skips the mask hook
        "kMaskExact": _b("logits_mask" not in hooks or a.mask.kind != MaskKind.ARBITRARY),
    })
    for which in ("lower", "upper"):
        if which in hs.bounds:
            sym, names = hs.bounds[which]
            args = ", ".join(f"p.{n}" for n in names)
            body = f"int r; {sym}({args}{', ' if args else ''}&r); return r;"
        else:
            body = "return 0;"
        fns.append(f"{_FN} int mask_{which}(const Params& p) {{ {body} }}")
    lines = ['#include "variant_params.h"', f"namespace attngen_gen {{\nstruct Hooks_d{head_dim} {{",
             params_struct(variant, hs.dims or {}), ffi_params(variant, hs.dims or {}), f"  static constexpr int kHeadDim = {head_dim};"]
    lines += [f"  static constexpr bool {k} = {v};" for k, v in flags.items()]
    lines += fns
    lines.append("};\n}  // namespace attngen_gen\n")
    return "\n".join(lines)
