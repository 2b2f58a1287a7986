"""Slot functions that refuse a call by name, for what a backend's kernels do not serve yet.

TVM's PagedKVCache reports an empty slot only when a forward needs it, as 'Function
"f_attention_prefill_with_tree_mask_" is not defined'. A backend that does not serve a slot fills it
with one of these host functions instead: taking the slot's exact argument list (the CPU slots'
``SLOT_SIGNATURES``), they fail with attngen's message, naming what is not served and what is.
Built for the host (LLVM) at run time, or added to a model as host PrimFuncs ahead of time.
"""
from __future__ import annotations

from attngen.codegen.cpu.tvm_slots import SLOT_SIGNATURES

# TVM's scalar arguments of the attention slots; every other argument is a tensor
SCALAR_TYPES = {"causal": "int32", "rotary_mode": "int32", "rope_scale": "float32", "rope_theta": "float32",
                "sm_scale": "float32"}


def refusing_function(signature_kind: str, message: str):
    """A host PrimFunc with the argument list of ``SLOT_SIGNATURES[signature_kind]`` that fails with ``message``."""
    import tvm
    from tvm import tirx as tir

    params = [tir.Var(name, SCALAR_TYPES.get(name, "handle")) for name in SLOT_SIGNATURES[signature_kind]]
    # the condition reads an argument, so the check stays a run-time one (TVM's slots pass rotary_mode >= 0)
    rotary_mode = params[SLOT_SIGNATURES[signature_kind].index("rotary_mode")]
    # (tirx.AssertStmt's Python constructor passes its arguments in another order than the FFI expects)
    body = tvm.get_global_func("tirx.AssertStmt")(rotary_mode < 0, tvm.ir.StringImm("RuntimeError"),
                                                   [tvm.ir.StringImm(message)], None)
    return tir.PrimFunc(params, body).with_attr("target", tvm.target.Target("llvm"))


TREE_MESSAGE = ("attngen: token-tree attention (a forward given token_tree_parent_ptr, speculative decoding) is not "
                "served by attngen's {backend} slots yet; verify drafts as chains, or use attngen's CPU cache "
                "(target='cpu'), which serves TVM's tree-mask slots")


def tree_refusals(backend: str) -> dict:
    """Role (``TREE_ROLES``) -> the refusing PrimFunc of that token-tree slot."""
    message = TREE_MESSAGE.format(backend=backend)
    return {"prefill_tree_mask_paged": refusing_function("paged_tree", message),
            "prefill_tree_mask": refusing_function("ragged_tree", message)}


def build_refusals(funcs: dict) -> dict:
    """Role -> the built host function (for a cache created in this process)."""
    import tvm

    mod = tvm.IRModule({tvm.ir.GlobalVar(f"refuse_{role}"): f.with_attr("global_symbol", f"refuse_{role}")
                        for role, f in funcs.items()})
    library = tvm.tirx.build(mod, target=tvm.target.Target("llvm"))
    return {role: library[f"refuse_{role}"] for role in funcs}
