"""The C++ side of a variant: a traits struct the CUDA templates are instantiated with.

``struct Hooks_d<D>`` holds the variant's extra parameters (``Params``), compile-time
flags (which hooks exist, per-element forms, the state algebra, where sm_scale and
log2 e are folded, the mask's bounds) and forwarding functions to the hook device
functions lowered by :mod:`.hooks_cuda`. Absent hooks are identities.
"""
from __future__ import annotations

from attngen.ir import HOOKS, StateAlgebra, TensorParam
from attngen.ir.mask_class import MaskKind

C_TYPES = {"float32": "float", "int32": "int", "int64": "int64_t", "uint8": "unsigned char",
           "float16": "half", "bfloat16": "__nv_bfloat16"}


def params_struct(variant) -> str:
    fields = []
    for p in variant.params:
        ctype = C_TYPES[p.dtype] + ("*" if isinstance(p, TensorParam) else "")
        fields.append(f"    {ctype} {p.name};")
    return "  struct Params {\n" + ("\n".join(fields) or "    int unused;") + "\n  };\n"


def _b(x: bool) -> str:
    return "true" if x else "false"


def traits_source(variant, hs, head_dim: int) -> str:
    """C++ source of ``attngen_gen::Hooks_d<head_dim>`` (after the hooks header)."""
    a = variant.analysis
    hooks = variant.hooks

    def call(sym, args):
        extra = "".join(f", p.{n}" for n in hs.params[sym])
        return f"{sym}({args}{extra}"

    lines = [f"namespace attngen_gen {{\nstruct Hooks_d{head_dim} {{", params_struct(variant)]
    flags = {
        "kHeadDim": str(head_dim),
        "kSoftmax": _b(variant.state == StateAlgebra.SOFTMAX),
        "kQScaleLog2e": _b(a.scale.q_scale_log2e),
        "kLogitsLog2e": _b(a.scale.logits_log2e),
        "kHasQueryTransform": _b("query_transform" in hooks),
        "kQueryElementwise": _b("query_transform" in hs.elementwise),
        "kHasKeyTransform": _b("key_transform" in hooks),
        "kKeyElementwise": _b("key_transform" in hs.elementwise),
        "kHasLogits": _b("logits_transform" in hooks),
        "kHasMask": _b("logits_mask" in hooks),
        "kHasOutputTransform": _b("output_transform" in hooks),
        "kOutputElementwise": _b("output_transform" in hs.elementwise),
        "kHasLower": _b("lower" in hs.bounds),
        "kHasUpper": _b("upper" in hs.bounds),
        # the mask is exactly its bounds (causal, sliding window): a tile inside them skips the mask hook
        "kMaskExact": _b("logits_mask" not in hooks or a.mask.kind != MaskKind.ARBITRARY),
    }
    for k, v in flags.items():
        lines.append(f"  static constexpr {'int' if k == 'kHeadDim' else 'bool'} {k} = {v};")
    fn = "  __device__ __forceinline__ static"
    # scalar hooks
    if "logits_transform" in hooks:
        body = f"float r; {call(hs.symbol('logits_transform'), 's, b, qo, kv, qh, kh')}, &r); return r;"
    else:
        body = "return s;"
    lines.append(f"{fn} float logits(const Params& p, float s, int b, int qo, int kv, int qh, int kh) {{ {body} }}")
    if "logits_mask" in hooks:
        body = f"bool r; {call(hs.symbol('logits_mask'), 'b, qo, kv, qh, kh')}, &r); return r;"
    else:
        body = "return true;"
    lines.append(f"{fn} bool mask(const Params& p, int b, int qo, int kv, int qh, int kh) {{ {body} }}")
    for which in ("lower", "upper"):
        if which in hs.bounds:
            sym, names = hs.bounds[which]
            args = ", ".join(f"p.{n}" for n in names)
            body = f"int r; {sym}({args}{', ' if args else ''}&r); return r;"
        else:
            body = "return 0;"
        lines.append(f"{fn} int mask_{which}(const Params& p) {{ {body} }}")
    # row hooks: per-element and whole-row forms
    row_args = {"query_transform": ("query", "int qo_pos, int qh", "qo_pos, qh"),
                "key_transform": ("key", "int kv_pos, int kh", "kv_pos, kh"),
                "output_transform": ("output", "int b, int qo_pos, int qh, float lse", "b, qo_pos, qh, lse")}
    for hook, (short, decl, args) in row_args.items():
        if hook in hs.elementwise:
            body = f"float r; {call(hs.elementwise[hook], f'row, i, {args}')}, &r); return r;"
        else:
            body = "return row[i];"
        lines.append(f"{fn} float {short}_elem(const Params& p, float* row, int i, {decl}) {{ {body} }}")
        if hook in hooks:
            body = f"{call(hs.symbol(hook), f'in, out, {args}')});"
        else:
            body = f"for (int i = 0; i < {head_dim}; ++i) out[i] = in[i];"
        lines.append(f"{fn} void {short}_row(const Params& p, float* in, float* out, {decl}) {{ {body} }}")
    lines.append("};\n}  // namespace attngen_gen\n")
    assert set(HOOKS) >= set(hooks)
    return "\n".join(lines)
