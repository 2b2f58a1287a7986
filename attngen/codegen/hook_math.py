"""How a hook's floating-point math is lowered on CUDA: hardware approximations or IEEE library calls.

TVM's CUDA intrinsic rules lower ``tanh``, ``exp``, ``log``, ... to the accurate CUDA math library
(``tanhf``, ``expf``, ``logf``) and a float division to an IEEE-rounded ``/``. Inside a prefill's
inner loop those cost more than the attention itself: ``tanhf`` is a branchy polynomial of some twenty
instructions and an IEEE division has a slow path, per score. A hook that soft-caps logits
(``c * tanh(s / c)``) ran at 40% of the plain kernel's speed with them.

``BuildConfig.hook_math`` chooses, per build:

* ``"approx"`` (default): the hardware approximations a hand-written kernel uses (FlashInfer's and
  FlashAttention's soft-cap use ``tanh.approx.f32``), each a few instructions on the special-function
  unit, with the errors in ``APPROX_MAX_ERROR`` (NVIDIA's PTX ISA and CUDA math documentation;
  tests/test_gpu_hook_math.py measures them against float64 on the GPU): far below the bf16 / fp16 rounding of the attention's inputs
  and output;
* ``"precise"``: TVM's accurate library calls, for variants whose hooks need full float32 accuracy.

Only the hooks' own math changes; the templates' online softmax is the same in both modes. The
rewrite runs on the hooks' TIR after TVM's intrinsic lowering, so ``attngen inspect`` and the
generated header show which function each call became.

In both modes a float local whose sine and cosine a hook takes (RoPE's angle) gets them from one
``sincosf`` (:func:`pair_sin_cos`): one argument reduction instead of two, the accuracy of ``sinf`` and
``cosf`` (and under ``--use_fast_math`` the same approximation as theirs); RoPE's hooks compile to 17% less
code.
"""
from __future__ import annotations

import re

import tvm
import tvm.tirx as tir

from attngen.ir import tir_utils as tu
from attngen.schedules.build_config import HOOK_MATH_MODES

# accurate CUDA library call (what TVM lowers to) -> its approximation: CUDA's own intrinsics, so that the
# hooks' source compiles on its own (TVM compiles it with NVRTC where a GPU is present)
APPROX_CALLS = {
    "tanhf": "__tanhf",  # one MUFU.TANH (tanh.approx.f32), sm_75+
    "expf": "__expf",
    "logf": "__logf",
    "log2f": "__log2f",
}
# Not approximated: exp2 (exp2f is already a few instructions around ex2.approx), sin / cos / pow. The fast
# forms of the last three (__sinf, __cosf, __powf) lose accuracy without bound outside a small range, and
# the hooks that use them (RoPE's angles pos * theta^(-2i/d), up to thousands of radians) run once per
# row, not per score, where precision costs little.
APPROX_DIVIDE = "__fdividef"  # float32 a / b

# Documented worst-case error of each approximation over the range a hook feeds it.
APPROX_MAX_ERROR = {
    "__tanhf": "relative about 2^-11 (tanh.approx.f32, PTX ISA)",
    "__expf": "2 + floor(|1.173 x|) ulp (CUDA math API)",
    "__logf": "absolute 2^-21.41 for x in [0.5, 2], else 3 ulp (CUDA math API)",
    "__log2f": "absolute 2^-22 for x in [0.5, 2], else 2 ulp (CUDA math API)",
    "__fdividef": "2 ulp for |b| in [2^-126, 2^126]; returns 0 for 2^126 < |b| < 2^128 (CUDA math API)",
}


def check_mode(mode: str) -> str:
    if mode not in HOOK_MATH_MODES:
        raise ValueError(f"hook_math {mode!r}: use one of {list(HOOK_MATH_MODES)}")
    return mode


def _approximate_call(call: tvm.ir.Call):
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.call_pure_extern"):
        return call
    name = call.args[0].value if isinstance(call.args[0], tvm.ir.StringImm) else None
    if name not in APPROX_CALLS or str(call.ty) != "float32":
        return call
    return tir.call_pure_extern("float32", APPROX_CALLS[name], *call.args[1:])


def _approximate_div(div: tir.Div):
    if str(div.ty) != "float32":
        return div
    return tir.call_pure_extern("float32", APPROX_DIVIDE, div.a, div.b)


def approximate(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (hooks after ``LowerIntrin``) with its accurate float32 math calls and divisions replaced by
    their hardware approximations."""
    funcs = {}
    for gv, func in mod.functions.items():
        body = tu.map_nodes(func.body, tvm.ir.Call, _approximate_call)
        body = tu.map_nodes(body, tir.Div, _approximate_div)
        funcs[gv] = tir.PrimFunc(func.params, body, func.ret_type, func.attrs)
    return tvm.IRModule(funcs)




_FLOAT_LOCAL = re.compile(r"^([ \t]*)float (\w+) = [^\n]*;$", re.M)


def _block_end(code: str, start: int) -> int:
    """The index of the brace that closes the block holding position ``start`` (or the end of ``code``)."""
    depth = 0
    for i in range(start, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            if depth == 0:
                return i
            depth -= 1
    return len(code)


def pair_sin_cos(code: str) -> str:
    """``code`` (generated CUDA hooks) with each float local ``x`` that feeds both ``sinf(x)`` and ``cosf(x)``
    in its scope computed once by ``sincosf(x, &x_sin, &x_cos)`` right after its declaration. TVM declares a
    let-bound local once and never assigns it again (checked: a local assigned anywhere is left alone)."""
    for m in reversed(list(_FLOAT_LOCAL.finditer(code))):  # from the end: earlier offsets stay valid
        indent, name = m.group(1), m.group(2)
        start, end = m.end(), _block_end(code, m.end())
        scope = code[start:end]
        sin, cos = (re.compile(rf"(?<![\w.]){f}\({name}\)") for f in ("sinf", "cosf"))
        if not (sin.search(scope) and cos.search(scope)) or re.search(rf"\b{name}\s*=[^=]", scope):
            continue
        s_name, c_name = f"{name}_sin", f"{name}_cos"
        if re.search(rf"\b({s_name}|{c_name})\b", scope):
            continue  # the names are taken in the scope
        scope = cos.sub(c_name, sin.sub(s_name, scope))
        pair = f"\n{indent}float {s_name}, {c_name};\n{indent}sincosf({name}, &{s_name}, &{c_name});"
        code = code[:start] + pair + scope + code[end:]
    return code
