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

import re

from dataclasses import dataclass

from attngen.ir import HOOKS, HookSpec, ScalarParam, StateAlgebra, TensorParam
from attngen.ir.mask_class import MaskKind, bounds_are_the_mask
from attngen.schedules.template_prefill_hopper import hopper_config_for, hopper_wide_for_long_rows

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


# bytes (= alignment) of each C type of a Params member, on the 64-bit host and device alike
_C_BYTES = {"float": 4, "int": 4, "int64_t": 8, "unsigned char": 1, "half": 2, "__nv_bfloat16": 2, "bool": 1}


def params_bytes(variant, dims: dict) -> int:
    """sizeof the Params struct of :func:`params_struct` (members in order, each at its alignment)."""
    members = []
    for p in variant.params:
        members.append(8 if isinstance(p, TensorParam) else _C_BYTES[C_TYPES[p.dtype]])
        members += [4] * len(_dims_of(p, dims))
    members = members or [4]  # "int unused"
    offset = 0
    for size in members:
        offset = (offset + size - 1) // size * size + size
    align = max(members)
    return (offset + align - 1) // align * align


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


@dataclass(frozen=True)
class HookCall:
    """One call from a forwarding function to a lowered hook function: its standard parameters (as
    declared and as passed), then the variant's extra parameters ``extras`` (read from ``p``), then,
    for a value, a trailing pointer of type ``ret``."""
    member: str  # the forwarding function, e.g. "logits", "query_elem", "mask_lower"
    symbol: str  # the lowered device function of the variant
    decl: str
    args: str
    extras: tuple[str, ...]
    ret: str | None

    def abi_name(self, head_dim: int) -> str:
        """The variant-independent extern "C" name of this call in link-time builds (hook_abi.h)."""
        return f"attngen_abi_d{head_dim}_{self.member}"


@dataclass(frozen=True)
class Forward:
    """One forwarding function of the traits: its C++ return type, parameters after ``p``, and either the
    hook call it makes or the identity body of an absent hook."""
    member: str
    returns: str
    decl: str
    call: HookCall | None
    identity: str

    def body(self, invoke) -> str:
        if self.call is None:
            return self.identity
        head = invoke(self.call)  # the call up to its closing parenthesis
        if self.call.ret is None:
            return f"{head});"
        return f"{self.call.ret} r; {head}{'' if head.endswith('(') else ', '}&r); return r;"

    def source(self, invoke) -> str:
        params = f", {self.decl}" if self.decl else ""
        return f"{_FN} {self.returns} {self.member}(const Params& p{params}) {{ {self.body(invoke)} }}"


def _row_hook(spec: HookSpec, hooks, hs, head_dim: int) -> tuple[dict[str, str], list[Forward]]:
    """Flags and forwarding functions of one row hook: the whole-row form and the per-element form
    (a thread computing only its elements)."""
    short = spec.cpp_name
    flags = {f"kHas{_camel(spec.name)}": _b(spec.name in hooks),
             f"k{_camel(short)}Elementwise": _b(spec.name in hs.elementwise)}
    decl, args = _scalar_args(spec)
    elem = None
    if spec.name in hs.elementwise:
        sym = hs.elementwise[spec.name]
        elem = HookCall(f"{short}_elem", sym, f"float* row, int i, {decl}", f"row, i, {args}",
                        tuple(hs.params[sym]), "float")
    row = None
    if spec.name in hooks:
        sym = hs.symbol(spec.name)
        row = HookCall(f"{short}_row", sym, f"float* in, float* out, {decl}", f"in, out, {args}",
                       tuple(hs.params[sym]), None)
    fns = [Forward(f"{short}_elem", "float", f"float* row, int i, {decl}", elem, "return row[i];"),
           Forward(f"{short}_row", "void", f"float* in, float* out, {decl}", row,
                   f"for (int i = 0; i < {head_dim}; ++i) out[i] = in[i];")]
    return flags, fns


def _scalar_hook(spec: HookSpec, hooks, hs) -> tuple[dict[str, str], list[Forward]]:
    """Flag and forwarding function of one scalar hook (its value comes back through a pointer)."""
    member, flag = spec.cpp_name, f"kHas{_camel(spec.cpp_name)}"
    identity = _b(spec.identity) if isinstance(spec.identity, bool) else spec.identity
    decl, args = _scalar_args(spec)
    ret = C_TYPES[spec.returns]
    call = None
    if spec.name in hooks:
        sym = hs.symbol(spec.name)
        call = HookCall(member, sym, decl, args, tuple(hs.params[sym]), ret)
    return {flag: _b(spec.name in hooks)}, [Forward(member, ret, decl, call, f"return {identity};")]


LOGITS_ROW_TERMS_DECL = "int batch, int qo_pos, int qo_head, int kv_head, float scale, float post, float* rt"
LOGITS_FROM_TERMS_DECL = ("float s, int batch, int qo_pos, int kv_pos, float kv_pos_f, int qo_head, int kv_head, "
                          "float* rt")


def _arg_names(decl: str) -> str:
    return ", ".join(part.split()[-1].lstrip("*") for part in decl.split(", "))


def _logits_split_forwards(split: dict, hs) -> list[Forward]:
    """``logits_row_terms`` (once per query row: the hook's row-invariant terms into ``rt``) and
    ``logits_from_terms`` (per score, from the raw score: ``post * logits(s * scale, ...)``), see
    codegen/logits_split.py; without a logits hook, the scaled score."""
    row = score = None
    if split:
        row = HookCall("logits_row_terms", split["row"], LOGITS_ROW_TERMS_DECL, _arg_names(LOGITS_ROW_TERMS_DECL),
                       tuple(hs.params[split["row"]]), None)
        score = HookCall("logits_from_terms", split["score"], LOGITS_FROM_TERMS_DECL,
                         _arg_names(LOGITS_FROM_TERMS_DECL), tuple(hs.params[split["score"]]), "float")
    return [Forward("logits_row_terms", "void", LOGITS_ROW_TERMS_DECL, row, "rt[0] = scale * post;"),
            Forward("logits_from_terms", "float", LOGITS_FROM_TERMS_DECL, score, "return s * rt[0];")]


MASK_ROW_TERMS_DECL = "int batch, int qo_pos, int qo_head, int kv_head, int* rt"
MASK_FROM_TERMS_DECL = "int batch, int qo_pos, int kv_pos, int qo_head, int kv_head, int* rt"
MASK_KEY_TERM_DECL = "int batch, int kv_pos, int kv_head"


def _mask_split_forwards(split: dict, hs) -> list[Forward]:
    """``mask_row_terms`` (once per query row: the mask's row-invariant reads into ``rt``) and
    ``mask_from_terms`` (per score), see codegen/mask_split.py; without a split, the mask itself; and
    ``mask_key_term``, the key term a conjunct compares with row term ``kMaskKeyTerm`` (the tile-map
    classifier's range test), 0 without one."""
    row = score = key = None
    if split:
        row = HookCall("mask_row_terms", split["row"], MASK_ROW_TERMS_DECL, _arg_names(MASK_ROW_TERMS_DECL),
                       tuple(hs.params[split["row"]]), None)
        score = HookCall("mask_from_terms", split["score"], MASK_FROM_TERMS_DECL, _arg_names(MASK_FROM_TERMS_DECL),
                         tuple(hs.params[split["score"]]), "bool")
        if "key" in split:
            key = HookCall("mask_key_term", split["key"], MASK_KEY_TERM_DECL, _arg_names(MASK_KEY_TERM_DECL),
                           tuple(hs.params[split["key"]]), "int")
    return [Forward("mask_row_terms", "void", MASK_ROW_TERMS_DECL, row, ""),
            Forward("mask_key_term", "int", MASK_KEY_TERM_DECL, key, "return 0;"),
            Forward("mask_from_terms", "bool", MASK_FROM_TERMS_DECL, score,
                    "return mask(p, batch, qo_pos, kv_pos, qo_head, kv_head);")]


# CUDA math that runs on the special-function unit (MUFU), as the hook math lowers it (codegen/hook_math.py): the
# approximations are one MUFU op each, the library forms at least one
SFU_CALL = re.compile(r"\b(__tanhf|__expf|__exp10f|__logf|__log2f|__log10f|__fdividef|__sinf|__cosf|__powf|exp2f|"
                      r"expf|exp10f|tanhf|logf|log2f|log10f|sinf|cosf|sincosf|powf|sqrtf|rsqrtf|__frcp_rn)\(")
SFU_CALLS_MAX = 2  # counts past it share one template object (the choice is the same)


def _function_body(code: str, symbol: str) -> str:
    """The definition's text of ``symbol`` in a hooks header (its declaration skipped)."""
    m = re.search(rf"\b{re.escape(symbol)}\([^)]*\)\s*{{", code)
    if m is None:
        return ""
    depth, i = 1, m.end()
    while depth and i < len(code):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        i += 1
    return code[m.end():i]


def score_sfu_calls(hs) -> int:
    """Special-function calls the logits hook makes per score (its per-score part where the hook is split into
    row terms), at most SFU_CALLS_MAX; 0 without a logits hook."""
    split = hs.logits_split or {}
    symbol = split.get("score") or (hs.functions or {}).get("logits_transform")
    if symbol is None:
        return 0
    return min(SFU_CALLS_MAX, len(SFU_CALL.findall(_function_body(hs.code, symbol))))


def traits_parts(variant, hs, head_dim: int) -> tuple[dict[str, str], list[Forward]]:
    """The traits' compile-time flags (which hooks exist, per-element forms, the state algebra, scale
    folding, the mask's bounds) and forwarding functions: what a template is compiled against, beyond
    the variant's parameter struct."""
    a = variant.analysis
    hooks = variant.hooks
    assert set(HOOKS) >= set(hooks)
    flags = {
        "kSoftmax": _b(variant.state == StateAlgebra.SOFTMAX),
        "kQScaleLog2e": _b(a.scale.q_scale_log2e),
        "kLogitsLog2e": _b(a.scale.logits_log2e),
    }
    fns = []
    for spec in HOOKS.values():
        f, code = _row_hook(spec, hooks, hs, head_dim) if spec.row else _scalar_hook(spec, hooks, hs)
        flags.update(f)
        fns += code
    flags.update({
        "kHasLower": _b("lower" in hs.bounds),
        "kHasUpper": _b("upper" in hs.bounds),
        # the mask is exactly its bounds (causal, sliding window): a tile inside them skips the mask hook
        "kMaskExact": _b("logits_mask" not in hooks or a.mask.kind != MaskKind.ARBITRARY),
    })
    split = hs.logits_split or {}
    flags["kLogitsRowTerms"] = str(split.get("terms", 0))
    # special-function calls per score of the logits hook (tanh, exp, a division, ...): the Hopper prefill moves
    # part of its softmax's 2^x onto the FMA pipe where they and the tile's tensor work leave MUFU the bottleneck
    # (csrc/hopper_tile.cuh hopper_poly_exp2_of_16)
    flags["kScoreSfuCalls"] = str(score_sfu_calls(hs))
    # an affine logits hook (rt[0] * s + rt[1] * kv_pos_f + rt[2]): a softmax template folds rt[0] into the
    # exponent and the key term into one FFMA per score on interior tiles (csrc/score_rules.cuh)
    affine = split.get("split") is not None and split["split"].affine and variant.state == StateAlgebra.SOFTMAX
    flags["kLogitsAffine"] = _b(affine)
    flags["kLogitsAffineKv"] = _b(affine and split["split"].affine_kv)
    # a post-scaled logits hook (g * rt[k]): a softmax template takes the row max of g and rt[k] into the
    # exponent's FFMA on interior tiles (csrc/score_rules.cuh apply_post_scaled); -1: none
    post = (split["split"].post_scale if split.get("split") is not None and variant.state == StateAlgebra.SOFTMAX
            else -1)
    flags["kLogitsPostScale"] = str(post)
    # |g| <= 1 (a tanh): the prefill templates may fix a bf16 row's max at 0 (csrc/score_rules.cuh fix_row_max)
    flags["kLogitsPostBounded"] = _b(post >= 0 and split["split"].post_bounded)
    fns += _logits_split_forwards(split, hs)
    msplit = hs.mask_split or {}
    flags["kMaskRowTerms"] = str(msplit.get("terms", 0))
    # the split mask reads only inside its tensors (codegen/mask_split.py): evaluated for every key of a
    # checked tile, unconditionally, so that one read of a key's value serves both rows of a fragment
    flags["kMaskTotal"] = _b(bool(msplit.get("total")))
    flags["kMaskKeyTerm"] = str(msplit.get("key_of", -1))  # -1: no key term
    # the Hopper prefill's wide tiles (176 keys at head_dim 128, 192 at 64), where the variant's kernels over
    # 16-bit caches take them
    # (csrc/hopper_tile.cuh hopper_wide_tiles adds the instance's conditions)
    flags["kHopperWideTiles"] = _b(hopper_config_for(variant, head_dim).wide)
    flags["kHopperWideLongRows"] = _b(hopper_wide_for_long_rows(variant, head_dim))
    # a mask whose constant bounds a plan counts key tiles by, no logits hook: the Hopper kernel's Split instance
    # for plans that cut appends' keys over the SMs (csrc/hopper_launch.cuh hopper_split_instance,
    # runtime/work_order.py _split_tail)
    flags["kHopperMaskedSplit"] = _b("logits_mask" in hooks and "logits_transform" not in hooks
                                     and bounds_are_the_mask(variant))
    fns += _mask_split_forwards(msplit, hs)
    for which in ("lower", "upper"):
        call = None
        if which in hs.bounds:
            sym, names = hs.bounds[which]
            call = HookCall(f"mask_{which}", sym, "", "", tuple(names), "int")
        fns.append(Forward(f"mask_{which}", "int", "", call, "return 0;"))
    return flags, fns


def _direct_call(call: HookCall) -> str:
    """A forwarding function's call of the lowered hook, its extra parameters read from ``p``."""
    args = [call.args] if call.args else []
    args += [f"p.{n}" for n in call.extras]
    return f"{call.symbol}({', '.join(args)}"


def flag_line(name: str, value: str) -> str:
    """A traits flag's line of the generated source (lto.record_abi rewrites boolean ones)."""
    return f"  static constexpr {'int' if value.lstrip('-').isdigit() else 'bool'} {name} = {value};"


def _flag_lines(head_dim: int, flags: dict[str, str]) -> list[str]:
    return [f"  static constexpr int kHeadDim = {head_dim};"] + [flag_line(k, v) for k, v in flags.items()]


def traits_source(variant, hs, head_dim: int) -> str:
    """C++ source of ``attngen_gen::Hooks_d<head_dim>`` (after the hooks header)."""
    flags, fns = traits_parts(variant, hs, head_dim)
    flags["kMaskReadsHeads"] = _b(variant.analysis.mask_reads_heads)  # read by the tile-map classifier alone
    # the host glue's part (TVM-FFI argument types, set_params) is left out of a split unit's device pass
    # (cuda_library.translation_units): it parses no TVM-FFI header
    host_only = ("#if !defined(__CUDA_ARCH__) || !defined(ATTNGEN_DEVICE_SPLIT)", "#endif")
    lines = [host_only[0], '#include "variant_params.h"', host_only[1],
             f"namespace attngen_gen {{\nstruct Hooks_d{head_dim} {{", params_struct(variant, hs.dims or {}),
             host_only[0], ffi_params(variant, hs.dims or {}), host_only[1]]
    lines += _flag_lines(head_dim, flags)
    lines += [f.source(_direct_call) for f in fns]
    lines.append("};\n}  // namespace attngen_gen\n")
    return "\n".join(lines)


# ---- link-time builds (codegen/lto.py, csrc/hook_abi.h) ----

ROW_TERMS_BUCKET = 4


def abi_row_terms(terms: int) -> int:
    """The row-term count a linked template is compiled for: ``terms`` rounded up to a multiple of
    ``ROW_TERMS_BUCKET`` (0 stays 0), so that hooks of 1-4 row terms (soft-cap's 2, ALiBi's 3) share one
    template object. The entries past the hook's own are zeroed and never read: once the hooks inline at the
    link, they are dead code (csrc/score_rules.cuh RowTerms)."""
    return -(-terms // ROW_TERMS_BUCKET) * ROW_TERMS_BUCKET


def abi_traits_source(variant, hs, head_dim: int) -> str:
    """The traits a prebuilt template is compiled against: ``attngen_gen::Hooks_d<head_dim>`` with the
    variant's flags, ``Params`` = ``attngen::ParamBlock`` and each present hook forwarded to its extern
    "C" ABI function. Its text is the template's hook signature: two variants with the same text share
    the template's object."""
    flags, fns = traits_parts(variant, hs, head_dim)
    for k in ("kLogitsRowTerms", "kMaskRowTerms"):
        flags[k] = str(abi_row_terms(int(flags[k])))
    # read by the tile-map classifier alone (csrc/tile_map.cuh), which serves only masks beyond their bounds:
    # false for every other variant, so that the flag splits no template object of theirs
    maps_tiles = flags["kHasMask"] == "true" and flags["kMaskExact"] == "false"
    flags["kMaskReadsHeads"] = _b(maps_tiles and variant.analysis.mask_reads_heads)
    calls = [f.call for f in fns if f.call is not None]

    def invoke(call: HookCall) -> str:
        return f"{call.abi_name(head_dim)}(&p{', ' + call.args if call.args else ''}"

    decls = [f'extern "C" __device__ {_abi_prototype(c, head_dim)};' for c in calls]
    lines = ["#pragma once", '#include "hook_abi.h"', *decls,
             f"namespace attngen_gen {{\nstruct Hooks_d{head_dim} {{", "  using Params = attngen::ParamBlock;"]
    lines += _flag_lines(head_dim, flags)
    lines += [f.source(invoke) for f in fns]
    lines.append("};\n}  // namespace attngen_gen\n")
    return "\n".join(lines)


def _abi_prototype(call: HookCall, head_dim: int) -> str:
    params = ["const attngen::ParamBlock* block"] + ([call.decl] if call.decl else [])
    if call.ret is not None:
        params.append(f"{call.ret}* ret")
    return f"void {call.abi_name(head_dim)}({', '.join(params)})"


def abi_hooks_source(variant, hs, head_dim: int) -> str:
    """The variant's side of the boundary (after its hooks header): its Params as
    ``attngen_gen::VariantParams_d<head_dim>`` and one extern "C" definition per ABI function, reading
    the block as those Params and calling the lowered hook."""
    _, fns = traits_parts(variant, hs, head_dim)
    vp = f"VariantParams_d{head_dim}"
    lines = ['#include "hook_abi.h"', "namespace attngen_gen {",
             params_struct(variant, hs.dims or {}).replace("  struct Params {", f"struct {vp} {{").replace(
                 "\n  };", "\n};"), "}  // namespace attngen_gen"]
    for f in fns:
        if f.call is None:
            continue
        c = f.call
        head = _direct_call(c)
        ret = "" if c.ret is None else ("ret" if head.endswith("(") else ", ret")
        lines.append(f'extern "C" __device__ {_abi_prototype(c, head_dim)} {{\n'
                     f"  [[maybe_unused]] const attngen_gen::{vp}& p = "
                     f"*reinterpret_cast<const attngen_gen::{vp}*>(block);\n"
                     f"  {head}{ret});\n}}")
    return "\n".join(lines) + "\n"


def linked_params_source(variant, hs, head_dim: int) -> str:
    """The exports file's view of the variant in a link-time build (host C++ only):
    ``attngen_gen::LinkedParams_d<head_dim>``, the variant's FFI parameters (``ExtraArgs``) packed by
    ``set_params`` into the block the linked kernels take. Its text is the parameter list: the exports
    are recompiled when it changes, never for a hook body."""
    dims = hs.dims or {}
    vp = params_struct(variant, dims).replace("  struct Params {", "  struct VariantParams {")
    setter = ffi_params(variant, dims).replace("Params& p", "VariantParams& p")
    decl = "".join(f", {_ffi_type(p)} {p.name}" for p in variant.params)
    names = "".join(f", {p.name}" for p in variant.params)
    return "\n".join([
        "namespace attngen_gen {", f"struct LinkedParams_d{head_dim} {{",
        vp, setter.replace("static void set_params(", "static void fill_variant_params("),
        f"  static void set_params(const char* entry, attngen::ParamBlock& block{decl}) {{",
        f"    VariantParams p{{}};\n    fill_variant_params(entry, p{names});\n"
        "    attngen::pack_params(block, p);\n  }",
        "};", "}  // namespace attngen_gen\n"])
