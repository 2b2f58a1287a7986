"""CPU backend build: one IRModule of attention functions with the hooks inlined, built by LLVM."""
from __future__ import annotations

from pathlib import Path

import tvm
from tvm.target import Target

from attngen.schedules.build_config import BuildConfig, symbol

from .attention_tir import attention_program
from .program_spec import CPUKernelSpec, kernel_flags
from .inline_hooks import inline_hooks

CPU_TARGET = {"kind": "llvm"}


def cpu_kernel_specs(variant, cfg: BuildConfig) -> dict[str, CPUKernelSpec]:
    """Exported symbol -> kernel spec, for every (kind, layout, dtype pair, head_dim) the config asks for
    (K/V in the query dtype, or fp8 K/V with scales: BuildConfig refuses other pairs)."""
    flags = kernel_flags(variant)
    specs = {}
    for pair in cfg.dtype_pairs:
        common = dict(flags, kv_dtype=pair.kv) if pair.kv_scaled else flags
        for d in cfg.head_dims:
            kinds = [CPUKernelSpec("ragged", False, d, pair.q, **common)]
            for layout in cfg.layouts:
                kinds.append(CPUKernelSpec("paged", False, d, pair.q, layout, **common))
                kinds.append(CPUKernelSpec("paged", True, d, pair.q, layout, **common))
            for k in kinds:
                specs[symbol(k.func_name, pair.q, d, pair.kv)] = k
    return specs


def lower_cpu_module(variant, specs: dict[str, CPUKernelSpec]) -> tvm.IRModule:
    funcs = {}
    for sym, spec in specs.items():
        f = inline_hooks(attention_program(spec), variant, spec.head_dim)
        funcs[tvm.ir.GlobalVar(sym)] = f.with_attr("global_symbol", sym)
    return tvm.IRModule(funcs)


def build_cpu_library(mod: tvm.IRModule, out: Path) -> Path:
    target = Target(CPU_TARGET)
    # TVM's common-subexpression pass binds float subexpressions (e.g. a cast position) to
    # lets that its integer-set analysis then mis-handles; LLVM performs CSE itself.
    with target, tvm.transform.PassContext(config={"tirx.disable_cse_tir": True}):
        rt = tvm.tirx.build(mod, target=target)
    rt.export_library(str(out))
    return out
