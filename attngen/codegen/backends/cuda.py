"""The CUDA backend: the variant's hooks lowered to device functions per (arch, head_dim), the template
records' translation units per (head_dim, dtype pair), nvcc, and one linked library of TVM-FFI functions.

Which templates a build instantiates, what they need of an arch and which of their tiles must fit its
shared memory are read from the template registry (attngen/schedules/registry.py); every build directory
gets ``attngen_enums.h`` (the FFI enums) and ``attngen_tiles.h`` (the records' tile tables, which the
templates static_assert against through csrc/tile_checks.h).
"""
from __future__ import annotations

from attngen.ir import ConfigError, Site
from attngen.ir.hook_spec import hooks_at
from attngen.schedules.arch import arch_spec
from attngen.schedules.ffi_enums import enums_header
from attngen.schedules.registry import arch_problems, fit_problems, instantiated, selected
from attngen.schedules.tile_header import HEADER_NAME, tiles_header

from .. import nvcc
from ..cache import package_version
from ..host_library import host_cxx_version
from .base import Backend, BuildContext

# The code generators (hooks_cuda, cuda_library, cuda_variant, cuda_tvm_slots) import TVM and tvm-ffi (with
# torch): each stage imports those it uses, so that reading the tool versions for a cache key imports neither.


def _check_tvm_slots(variant, cfg) -> None:
    from ..cuda_tvm_slots import check_tvm_slot_variant

    check_tvm_slot_variant(variant, dict(cfg.tvm_constants))


# TemplateRecord.variant_check keys: build-time refusals of variants a template would serve wrongly
VARIANT_CHECKS = {
    "tvm_slots": _check_tvm_slots,
}


class CUDABackend(Backend):
    target = "cuda"

    def tool_versions(self, cfg=None) -> dict:
        # nvcc compiles the host glue with the host compiler against tvm-ffi's headers
        tools = {"nvcc": nvcc.nvcc_version(), "host C++ compiler": host_cxx_version(),
                 "tvm_ffi": package_version("apache-tvm-ffi")}
        if cfg is not None and cfg.link == "lto":  # the linked build's hook compiler and linker
            tools.update(nvjitlink=package_version("nvidia-nvjitlink"), nvrtc=package_version("nvidia-cuda-nvrtc"),
                         cuda_bindings=package_version("cuda-bindings"))
        return tools

    def schedule(self, ctx: BuildContext) -> dict:
        cfg, variant = ctx.config, ctx.variant
        for record in selected(cfg.kernels):
            if record.variant_check:
                VARIANT_CHECKS[record.variant_check](variant, cfg)
        if cfg.link == "lto":
            from ..lto import check_config

            check_config(cfg)
        problems = []
        for a in cfg.archs:
            spec = arch_spec(a)
            problems += arch_problems(spec, cfg.kernels)
            problems += fit_problems(spec, cfg.kernels, cfg.head_dims, cfg.dtype_pairs, cfg.max_group_size,
                                     any(h in variant.hooks for h in hooks_at(Site.KEY_LOAD)))
        if problems:
            raise ConfigError(f"variant '{variant.name}': " + "; ".join(problems) +
                              ". Build those head dims for a newer arch, or drop them from this build")
        return {"templates": [r.name for r in instantiated(cfg.kernels)],
                "cuda": [{"arch": a, "gencode": arch_spec(a).gencode, "head_dim": d}
                         for a in cfg.archs for d in cfg.head_dims]}

    def lower_hooks(self, ctx: BuildContext):
        from ..hooks_cuda import lower_hooks_cuda

        cfg = ctx.config
        return {(a, d): lower_hooks_cuda(ctx.variant, d, a, cfg.hook_math) for a in cfg.archs for d in cfg.head_dims}

    def instantiate(self, ctx: BuildContext) -> dict[str, str]:
        """Template instances (traits per head_dim, one TU per template, head_dim and dtype pair), the
        lowered hooks' headers per arch and, for a hooks-only build (no kernels), the hook objects' sources."""
        from ..cuda_library import translation_units
        from ..cuda_variant import traits_source

        lowered = ctx.artifacts["lower_hooks"]
        name, cfg = ctx.variant.name, ctx.config
        files = {}
        if cfg.kernels:
            files["attngen_enums.h"] = enums_header()
            files[HEADER_NAME] = tiles_header()
            first = cfg.archs[0]
            for d in cfg.head_dims:
                files[f"variant_d{d}.cuh"] = (f'#pragma once\n#include "hooks_{name}_d{d}_{first}.cuh"\n'
                                              + traits_source(ctx.variant, lowered[(first, d)], d))
                if cfg.link != "lto":  # a linked build's sources are its cached objects' (codegen/lto.py)
                    for pair in cfg.dtype_pairs:
                        files.update(translation_units(ctx.variant, cfg, d, pair))
        for a in cfg.archs:
            includes = []
            for d in cfg.head_dims:
                header = f"hooks_{name}_d{d}_{a}.cuh"
                files[header] = lowered[(a, d)].code
                includes.append(f'#include "{header}"')
            if not cfg.kernels:  # a hooks-only build's product: relocatable hook objects per arch
                files[f"hooks_{a}.cu"] = (
                    "// Hook object for link-time inlining into the user's own templates.\n"
                    '#define ATTNGEN_HOOK extern "C" __device__\n' + "\n".join(includes) + "\n")
        return files

    def compile(self, ctx: BuildContext) -> dict:
        from ..cuda_library import compile_device_code, compile_library, exported_functions
        from ..logits_split import FLOAT_POSITION_LIMIT

        out, cfg, sources = ctx.out_dir, ctx.config, ctx.artifacts["instantiate"]
        headers = sorted(f for f in sources if f.endswith(".cuh"))
        split = next(iter(ctx.artifacts["lower_hooks"].values())).logits_split
        # the prefill templates pass key positions as floats to this variant's logits hook: exact below
        # the limit the runtime holds its batches to (codegen/logits_split.py)
        limits = {"float_position_limit": FLOAT_POSITION_LIMIT} if split and split["split"].float_positions else {}
        if cfg.kernels and cfg.link == "lto":  # the hook objects are the linked build's own (LTO-IR)
            from ..lto_library import build_linked_library

            result = build_linked_library(ctx)
            return {**result, "headers": headers, "functions": exported_functions(cfg), **limits}
        result = {"headers": headers}
        if not cfg.kernels:  # the hook objects are the product; with templates, the kernels compile the hooks
            flags = ("-dc", "--use_fast_math") if cfg.fast_math else ("-dc",)
            jobs = [nvcc.NvccJob(out / f"hooks_{a}.cu", out / f"hooks_{a}.o", arch_spec(a).gencode, flags)
                    for a in cfg.archs]
            nvcc.run_jobs(jobs)
            result["objects"] = [j.output.name for j in jobs]
        tus = sorted(f for f in sources if f.startswith("attention_"))
        if cfg.kernels and cfg.link == "check":
            result["cubins"] = [c.name for c in compile_device_code(out, tus, cfg)]
        elif cfg.kernels:
            result["library"] = compile_library(out, tus, cfg, ctx.variant.name).name
            result["functions"] = exported_functions(cfg)
        return {**result, **limits}
