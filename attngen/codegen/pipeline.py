"""The staged build: validate -> analyze -> schedule -> lower_hooks -> instantiate -> compile.

Each stage is a plain function from the build context to one artifact; the
artifacts are recorded in order and, with ``ATTNGEN_DUMP=dir`` (or ``dump=``),
written to ``dir/<variant>/<nn>_<stage>.txt``. The whole build is cached by a
content hash (see :mod:`.cache`).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import tvm

import attngen
from attngen.ir import ConfigError, Variant
from attngen.schedules.arch import arch_spec
from attngen.schedules.tiles import check_fits
from attngen.schedules.build_config import DTYPE_SHORT, BuildConfig
from attngen.schedules.ffi_enums import enums_header

from . import nvcc
from .cache import BuildCache, content_key, hash_files
from .cpu.build import build_cpu_library, cpu_kernel_specs, lower_cpu_module
from .cuda_library import compile_library, exported_functions, translation_units
from .cuda_tvm_slots import check_tvm_slot_variant
from .cuda_variant import traits_source
from .hooks_cuda import lower_hooks_cuda

PACKAGE = Path(attngen.__file__).parent


@dataclass
class BuildContext:
    variant: Variant
    config: BuildConfig
    out_dir: Path | None = None
    artifacts: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildResult:
    variant: str
    config: BuildConfig
    directory: Path  # the cache entry holding every artifact
    library: Path | None  # the loadable shared library (cpu target)
    objects: tuple[Path, ...]  # compiled device objects (cuda target)
    manifest: dict
    cache_hit: bool
    seconds: float


def stage_validate(ctx: BuildContext) -> str:
    return ctx.variant.ir_text()  # a Variant is validated when it is constructed


def stage_analyze(ctx: BuildContext) -> str:
    return ctx.variant.analysis.describe()


def stage_schedule(ctx: BuildContext) -> dict:
    cfg = ctx.config
    if cfg.target == "cpu":
        return {"cpu": {sym: spec.__dict__ for sym, spec in cpu_kernel_specs(ctx.variant, cfg).items()}}
    group_tiles = [g for g in (1, 2, 4, 8) if g <= cfg.max_group_size]
    templates = set(cfg.kernels) | ({"decode", "prefill"} if "tvm" in cfg.kernels else set())
    if "tvm" in cfg.kernels:
        check_tvm_slot_variant(ctx.variant, dict(cfg.tvm_constants))
    problems = [p for a in cfg.archs for p in check_fits(arch_spec(a), templates, cfg.head_dims, group_tiles,
                                                         "key_transform" in ctx.variant.hooks)]
    if problems:
        raise ConfigError(f"variant '{ctx.variant.name}': " + "; ".join(problems) +
                          ". Build those head dims for a newer arch, or drop them from this build")
    return {"cuda": [{"arch": a, "gencode": arch_spec(a).gencode, "head_dim": d}
                     for a in cfg.archs for d in cfg.head_dims]}


def stage_lower_hooks(ctx: BuildContext):
    cfg = ctx.config
    if cfg.target == "cpu":
        return lower_cpu_module(ctx.variant, cpu_kernel_specs(ctx.variant, cfg))
    return {(a, d): lower_hooks_cuda(ctx.variant, d, a) for a in cfg.archs for d in cfg.head_dims}


def stage_instantiate(ctx: BuildContext) -> dict[str, str]:
    """Source files to compile (cuda) or the module text (cpu), by file name."""
    lowered = ctx.artifacts["lower_hooks"]
    if ctx.config.target == "cpu":
        return {"module.tir.py": lowered.script()}
    files = {}
    name = ctx.variant.name
    cfg = ctx.config
    if cfg.kernels:  # template instances: traits per head_dim, one TU per (head_dim, dtype)
        files["attngen_enums.h"] = enums_header()
        first = cfg.archs[0]
        for d in cfg.head_dims:
            hs = lowered[(first, d)]
            files[f"variant_d{d}.cuh"] = (f'#pragma once\n#include "hooks_{name}_d{d}_{first}.cuh"\n'
                                          + traits_source(ctx.variant, hs, d))
            for dt in cfg.dtypes:
                files.update(translation_units(ctx.variant, cfg, d, dt))
    for a in ctx.config.archs:
        includes = []
        for d in ctx.config.head_dims:
            header = f"hooks_{name}_d{d}_{a}.cuh"
            files[header] = lowered[(a, d)].code
            includes.append(f'#include "{header}"')
        files[f"hooks_{a}.cu"] = (
            "// Hook object for link-time inlining into the prebuilt templates.\n"
            '#define ATTNGEN_HOOK extern "C" __device__\n' + "\n".join(includes) + "\n")
    return files


def stage_compile(ctx: BuildContext) -> dict:
    out = ctx.out_dir
    for fname, text in ctx.artifacts["instantiate"].items():
        (out / fname).write_text(text)
    name = ctx.variant.name
    if ctx.config.target == "cpu":
        lib = build_cpu_library(ctx.artifacts["lower_hooks"], out / f"lib{name}_cpu.so")
        return {"library": lib.name, "functions": sorted(ctx.artifacts["schedule"]["cpu"])}
    flags = ("-dc", "--use_fast_math") if ctx.config.fast_math else ("-dc",)
    jobs = [nvcc.NvccJob(out / f"hooks_{a}.cu", out / f"hooks_{a}.o", arch_spec(a).gencode, flags)
            for a in ctx.config.archs]
    nvcc.run_jobs(jobs)
    result = {"objects": [j.output.name for j in jobs],
              "headers": sorted(f for f in ctx.artifacts["instantiate"] if f.endswith(".cuh"))}
    if ctx.config.kernels:
        tus = sorted(f for f in ctx.artifacts["instantiate"] if f.startswith("attention_"))
        lib = compile_library(out, tus, ctx.config, name)
        result["library"] = lib.name
        result["functions"] = exported_functions(ctx.config)
    return result


STAGES: dict[str, Callable[[BuildContext], object]] = {
    "validate": stage_validate,
    "analyze": stage_analyze,
    "schedule": stage_schedule,
    "lower_hooks": stage_lower_hooks,
    "instantiate": stage_instantiate,
    "compile": stage_compile,
}


def _dump_text(artifact) -> str:
    if isinstance(artifact, tvm.IRModule):
        return artifact.script()
    if isinstance(artifact, str):
        return artifact
    if isinstance(artifact, dict) and all(isinstance(v, str) for v in artifact.values()):
        return "\n".join(f"// ==== {k} ====\n{v}" for k, v in artifact.items())
    if isinstance(artifact, dict) and artifact and hasattr(next(iter(artifact.values())), "code"):
        return "\n".join(f"// ==== {k} ====\n{v.code}" for k, v in artifact.items())
    return json.dumps(artifact, indent=2, default=str)


def cache_key(variant: Variant, cfg: BuildConfig) -> str:
    sources = list((PACKAGE / "codegen").rglob("*.py")) + list((PACKAGE / "csrc").glob("*"))
    sources += list((PACKAGE / "schedules").glob("*.py"))
    return content_key({
        "ir": variant.ir_text(),
        "config": cfg.key(),
        "sources": hash_files([p for p in sources if p.is_file()]),
        "tvm": tvm.__version__,
        "nvcc": nvcc.nvcc_version() if cfg.target == "cuda" else None,
        "attngen": attngen.__version__,
    })


def run_pipeline(variant: Variant, cfg: BuildConfig, *, cache: BuildCache | None = None,
                 dump: str | Path | None = None, log: Callable[[str], None] | None = None) -> BuildResult:
    log = log or (lambda msg: None)
    cache = cache or BuildCache()
    dump = dump or os.environ.get("ATTNGEN_DUMP")
    t0 = time.perf_counter()
    key = cache_key(variant, cfg)

    def run_stages(out_dir: Path | None, names) -> BuildContext:
        ctx = BuildContext(variant, cfg, out_dir)
        for i, name in enumerate(STAGES):
            if name not in names:
                continue
            log(f"  [{i + 1}/{len(STAGES)}] {name}")
            ctx.artifacts[name] = STAGES[name](ctx)
            if dump:
                d = Path(dump) / variant.name
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{i:02d}_{name}.txt").write_text(_dump_text(ctx.artifacts[name]))
        return ctx

    def build(out_dir: Path) -> None:
        ctx = run_stages(out_dir, STAGES)
        manifest = {
            "variant": variant.name,
            "state": variant.state.value,
            "params": [{"name": p.name, "kind": type(p).__name__, "dtype": p.dtype} for p in variant.params],
            "config": json.loads(cfg.key()),
            "mask": variant.analysis.mask.describe(),
            **ctx.artifacts["compile"],
        }
        (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))

    directory, hit = cache.get_or_build(key, build)
    manifest = json.loads((directory / "manifest.json").read_text())
    if hit and dump:  # the stages' artifacts were asked for: rerun all but compile, which is cached
        run_stages(None, [n for n in STAGES if n != "compile"])
        compile_idx = list(STAGES).index("compile")
        (Path(dump) / variant.name / f"{compile_idx:02d}_compile.txt").write_text(json.dumps(manifest, indent=2))
    lib = directory / manifest["library"] if "library" in manifest else None
    objs = tuple(directory / o for o in manifest.get("objects", ()))
    return BuildResult(variant.name, cfg, directory, lib, objs, manifest, hit, time.perf_counter() - t0)
