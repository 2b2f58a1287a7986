"""The CPU backend: attention functions with the hooks inlined, one IRModule built by LLVM."""
from __future__ import annotations

from ..host_library import host_cxx_version
from .base import Backend, BuildContext


class CPUBackend(Backend):
    target = "cpu"

    def tool_versions(self, cfg=None) -> dict:
        return {"host C++ compiler": host_cxx_version()}  # LLVM is TVM's, which the key holds; the host compiler links

    def schedule(self, ctx: BuildContext) -> dict:
        from attngen.codegen.cpu.build import cpu_kernel_specs  # imports TVM: loaded by the stage using it

        return {"cpu": {sym: spec.__dict__ for sym, spec in cpu_kernel_specs(ctx.variant, ctx.config).items()}}

    def lower_hooks(self, ctx: BuildContext):
        from attngen.codegen.cpu.build import cpu_kernel_specs, lower_cpu_module

        return lower_cpu_module(ctx.variant, cpu_kernel_specs(ctx.variant, ctx.config))

    def instantiate(self, ctx: BuildContext) -> dict[str, str]:
        return {"module.tir.py": ctx.artifacts["lower_hooks"].script()}

    def compile(self, ctx: BuildContext) -> dict:
        from attngen.codegen.cpu.build import build_cpu_library

        lib = build_cpu_library(ctx.artifacts["lower_hooks"], ctx.out_dir / f"lib{ctx.variant.name}_cpu.so")
        return {"library": lib.name, "functions": sorted(ctx.artifacts["schedule"]["cpu"])}
