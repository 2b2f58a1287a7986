"""The staged build: validate -> analyze -> schedule -> lower_hooks -> instantiate -> compile.

Each stage is a plain function from the build context to one artifact; the artifacts are recorded in
order and, with ``ATTNGEN_DUMP=dir`` (or ``dump=``), written to ``dir/<variant>/<nn>_<stage>.txt``. The
target's stages belong to its backend object (:mod:`.backends`), looked up once from ``config.target``.
The whole build is cached by a content hash (see :mod:`.cache` and :func:`cache_key`); the key's parts
other than the variant's IR (:func:`build_inputs`) are computed without importing TVM, so that a request
keyed by the variant's source (:func:`request_key`) can find a finished build in a fresh process cheaply.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import attngen
from attngen.schedules.build_config import BuildConfig

from .backends import BuildContext, backend_for
from .cache import BuildCache, content_key, hash_files, package_version, python_environment
from .nvcc import compiler_env

if TYPE_CHECKING:  # a Variant's module imports TVM
    from attngen.ir import Variant

PACKAGE = Path(attngen.__file__).parent
# Everything under the package that takes part in a build: the variant IR and its analyses, the schedules
# and template records, the code generators, the C++ templates, and the build entry point. A variant's
# own definition enters the key through its IR text.
BUILD_SOURCES = ("ir", "schedules", "codegen", "csrc", "build.py")


@dataclass(frozen=True)
class BuildResult:
    variant: str
    config: BuildConfig
    directory: Path  # the cache entry holding every artifact
    library: Path | None  # the loadable shared library
    objects: tuple[Path, ...]  # compiled device objects (cuda target)
    manifest: dict
    cache_hit: bool
    seconds: float

    @classmethod
    def from_entry(cls, variant: str, config: BuildConfig, directory: Path, cache_hit: bool,
                   seconds: float) -> BuildResult:
        """The result a finished cache entry describes (its manifest names the library and objects)."""
        manifest = json.loads((directory / "manifest.json").read_text())
        lib = directory / manifest["library"] if "library" in manifest else None
        objs = tuple(directory / o for o in manifest.get("objects", ()))
        return cls(variant, config, directory, lib, objs, manifest, cache_hit, seconds)


def stage_validate(ctx: BuildContext) -> str:
    return ctx.variant.ir_text()  # a Variant is validated when it is constructed


def stage_analyze(ctx: BuildContext) -> str:
    return ctx.variant.analysis.describe()


def stage_schedule(ctx: BuildContext) -> dict:
    return ctx.backend.schedule(ctx)


def stage_lower_hooks(ctx: BuildContext):
    return ctx.backend.lower_hooks(ctx)


def stage_instantiate(ctx: BuildContext) -> dict[str, str]:
    """Source files to compile (cuda) or the module text (cpu), by file name."""
    return ctx.backend.instantiate(ctx)


def stage_compile(ctx: BuildContext) -> dict:
    for fname, text in ctx.artifacts["instantiate"].items():
        (ctx.out_dir / fname).write_text(text)
    return ctx.backend.compile(ctx)


STAGES: dict[str, Callable[[BuildContext], object]] = {
    "validate": stage_validate,
    "analyze": stage_analyze,
    "schedule": stage_schedule,
    "lower_hooks": stage_lower_hooks,
    "instantiate": stage_instantiate,
    "compile": stage_compile,
}


def _dump_text(artifact) -> str:
    import tvm

    if isinstance(artifact, tvm.IRModule):
        return artifact.script()
    if isinstance(artifact, str):
        return artifact
    if isinstance(artifact, dict) and all(isinstance(v, str) for v in artifact.values()):
        return "\n".join(f"// ==== {k} ====\n{v}" for k, v in artifact.items())
    if isinstance(artifact, dict) and artifact and hasattr(next(iter(artifact.values())), "code"):
        return "\n".join(f"// ==== {k} ====\n{v.code}" for k, v in artifact.items())
    return json.dumps(artifact, indent=2, default=str)


def _source_files(path: Path) -> list[Path]:
    """``path`` itself, or every file below it, bytecode caches excluded."""
    found = [path] if path.is_file() else path.rglob("*")
    return [p for p in found if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def build_source_files(package: Path = PACKAGE) -> list[Path]:
    """Every file of ``BUILD_SOURCES`` under ``package`` (directories recursively, caches excluded)."""
    return sorted(f for name in BUILD_SOURCES for f in _source_files(package / name))


def build_inputs(cfg: BuildConfig, *, package: Path = PACKAGE) -> dict:
    """Every input of a build but the variant: the config (target, archs, head dims, dtypes and K/V dtypes,
    layouts, kernels, flags, hook math), attngen's build sources, TVM (whose LLVM builds the CPU target and
    whose printer makes the IR text), the target's tools and the environment variables they read
    (``nvcc.COMPILER_ENV``), and the host's machine type."""
    return {
        "config": cfg.key(),
        "sources": hash_files(build_source_files(package), root=package),
        "tvm": package_version("apache-tvm"),
        "tvm_ffi": package_version("apache-tvm-ffi"),
        "tools": backend_for(cfg.target).tool_versions(cfg),
        "compiler_env": compiler_env(),
        "machine": platform.machine(),
        "attngen": attngen.__version__,
    }


def cache_key(variant: Variant, cfg: BuildConfig, *, package: Path = PACKAGE) -> str:
    """The build's key: the variant's IR text and :func:`build_inputs`."""
    return build_keys(variant, cfg, package=package)[0]


def build_keys(variant: Variant, cfg: BuildConfig, *, package: Path = PACKAGE) -> tuple[str, str, dict]:
    """(the build's key, its stand-in's key, the tools' versions): the stand-in (see
    ``BuildCache.get_or_build_with_tools``) is keyed by the same inputs but the tools and the environment
    variables they read, so that a machine without the tools finds a library built elsewhere."""
    ir, inputs = variant.ir_text(), build_inputs(cfg, package=package)
    toolless = {k: v for k, v in inputs.items() if k not in ("tools", "compiler_env")}
    return (content_key({"ir": ir, **inputs}), content_key({"stand_in": "variant library", "ir": ir, **toolless}),
            inputs["tools"])


def package_files(package: Path = PACKAGE) -> list[Path]:
    """Every source file of the attngen package (what a variant's definition may run through)."""
    return sorted(_source_files(package))


def request_key(source: dict, cfg: BuildConfig, *, package: Path = PACKAGE) -> str:
    """A key for a build asked for by the variant's source instead of its IR (``source``: a built-in's
    name, or a file's path and text, and which variant of it). Making the Variant from that source may
    run any of attngen and the installed packages, so those are in the key too; the user's own modules
    that the file imports are a record's ``depends_on`` (see :class:`.cache.BuildCache`)."""
    return content_key({"source": source, "package": hash_files(package_files(package), root=package),
                        "python": python_environment(), **build_inputs(cfg, package=package)})


def run_pipeline(variant: Variant, cfg: BuildConfig, *, cache: BuildCache | None = None,
                 dump: str | Path | None = None, log: Callable[[str], None] | None = None) -> BuildResult:
    log = log or (lambda msg: None)
    cache = cache or BuildCache()
    dump = dump or os.environ.get("ATTNGEN_DUMP")
    backend = backend_for(cfg.target)
    t0 = time.perf_counter()
    key, stand_in, tools = build_keys(variant, cfg)

    def run_stages(out_dir: Path | None, names) -> BuildContext:
        ctx = BuildContext(variant, cfg, backend, out_dir, cache=cache)
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

    directory, hit = cache.get_or_build_with_tools(key, build, stand_in=stand_in, tools=tools,
                                                   what=f"the {cfg.target} library of {variant.name}")
    if hit and dump:  # the stages' artifacts were asked for: rerun all but compile, which is cached
        run_stages(None, [n for n in STAGES if n != "compile"])
        compile_idx = list(STAGES).index("compile")
        manifest = json.loads((directory / "manifest.json").read_text())
        (Path(dump) / variant.name / f"{compile_idx:02d}_compile.txt").write_text(json.dumps(manifest, indent=2))
    return BuildResult.from_entry(variant.name, cfg, directory, hit, time.perf_counter() - t0)
