"""The ``attngen`` command line: build a variant, inspect what attngen made of it, list built-ins.

Starting it is cheap: TVM (and with tvm-ffi, torch) is imported by the subcommand stage that needs it,
not here. ``attngen build`` first looks for a finished build by the request's source key (the variant's
file text or built-in name, the config, attngen's sources, the tools and the Python environment; see
:func:`attngen.codegen.pipeline.request_key`), and only on a miss loads the variant and runs the
pipeline, whose own key is the variant's IR; ``attngen list`` prints the table the package ships
(``attngen.builtin_listing``) while it is current, else computes it once into the build cache, keyed by
attngen's sources and the environment.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import os
import shutil
import sys
import time
from pathlib import Path

from attngen.codegen.cache import (PREBUILT_ENV, BuildCache, content_key, entry_is_sealed, hash_files,
                                   python_environment)
from attngen.codegen.nvcc import NvccError
from attngen.ir.errors import ConfigError, VariantError, repeated
from attngen.ir.hook_spec import row_hooks
from attngen.schedules import ARCHS, BuildConfig
from attngen.schedules.arch import arch_spec
from attngen.schedules.build_config import HEAD_DIMS_CPU, HOOK_MATH_MODES
from attngen.schedules.registry import KERNELS, TEMPLATES
from attngen.schedules.template_decode import GROUP_TILES

DESCRIPTION = """\
attngen compiles attention variants written as TVM TensorIR hooks.

  attngen build examples/logits_softcap.py --target cpu --head-dim 64
  attngen build causal --target cuda --arch sm_80,sm_90a --head-dim 128 --dtype float16
  attngen inspect examples/logits_softcap.py
  attngen list
"""


DEFAULT_KERNELS = ("decode", "prefill")
# every head dim some build serves (the CPU backend's and the CUDA templates'): what inspect specialises for
INSPECT_HEAD_DIMS = tuple(sorted(set(HEAD_DIMS_CPU) | {d for r in TEMPLATES.values() for d in r.head_dims}))


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _head_dims(text: str) -> tuple[int, ...]:
    """--head-dim: comma-separated whole numbers."""
    try:
        return tuple(int(x) for x in _csv(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated whole numbers, e.g. 64,128") from None


def _kernels(text: str) -> tuple[str, ...]:
    """--kernels: comma-separated template names, or 'none' for the hook objects only."""
    if text.strip() == "none":
        return ()
    names = _csv(text)
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected template names among {', '.join(KERNELS)}, or 'none' "
                                         "for the hook objects only")
    return names


def _constant(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not sep or not name or number is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected name=number, e.g. soft_cap=30")
    return name, int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a Python file defining a Variant, or a built-in variant name (see 'attngen list')")
    p.add_argument("--variant", help="which variant, when the file defines several")
    p.add_argument("--constant", type=_constant, action="append", default=[], metavar="NAME=VALUE",
                   help="compile a scalar parameter in as a constant (Variant.with_constants); repeatable")


def _constants(args) -> dict:
    """--constant NAME=VALUE options as a dict, each name once."""
    twice = repeated(name for name, _ in args.constant)
    if twice:
        raise ConfigError(f"--constant: {twice} given more than once; give each parameter one value")
    return dict(args.constant)


def _load_variant(args):
    from attngen.loader import pick_variant

    constants = _constants(args)
    v = pick_variant(args.source, args.variant)
    return v.with_constants(**constants) if constants else v


def _check_directories(args) -> None:
    """The directory options name directories (or paths to make them at), not files."""
    for flag in ("cache_dir", "out", "dump"):
        path = getattr(args, flag, None)
        if path is not None and path.exists() and not path.is_dir():
            raise ConfigError(f"--{flag.replace('_', '-')} {path}: exists and is not a directory; give a directory")


def _add_config(b: argparse.ArgumentParser) -> None:
    """The build configuration's options (BuildConfig), shared by build and prebuild."""
    b.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: a shared library of TVM-FFI attention functions built by LLVM; "
                        "cuda: the hooks lowered to CUDA and compiled with nvcc per arch (default: cpu)")
    b.add_argument("--arch", type=_csv, default=(),
                   help=f"cuda only: comma-separated archs among {', '.join(ARCHS)}")
    b.add_argument("--head-dim", type=_head_dims, default=(128,),
                   help="comma-separated head dims to instantiate (default: 128)")
    b.add_argument("--dtype", type=_csv, default=None,
                   help="comma-separated query/output dtypes (cpu default float32; cuda default float16)")
    b.add_argument("--kv-dtype", type=_csv, default=(),
                   help="comma-separated K/V dtypes, one per --dtype (default: each query dtype); fp8 caches, "
                        "float8_e4m3fn or float8_e5m2, whose calls take k_scale and v_scale, build for cpu, and "
                        "for cuda with --kernels decode and/or prefill")
    b.add_argument("--layout", type=_csv, default=("NHD", "HND"),
                   help="paged-KV layouts to instantiate: NHD, HND (default: both)")
    b.add_argument("--kernels", type=_kernels, default=DEFAULT_KERNELS,
                   help=f"cuda: templates to instantiate into the library ({', '.join(KERNELS)}), or 'none' for "
                        "the hook objects only (default: decode,prefill)")
    b.add_argument("--max-group-size", type=int, default=8,
                   help="cuda: largest GQA group (num_qo_heads / num_kv_heads) the decode template serves: "
                        f"one of {', '.join(map(str, GROUP_TILES))} (default: 8)")
    b.add_argument("--fast-math", action="store_true",
                   help="cuda: nvcc --use_fast_math over the whole library, templates included; off by default")
    b.add_argument("--hook-math", choices=HOOK_MATH_MODES, default="approx",
                   help="cuda: the hooks' float math: 'approx' (hardware approximations: tanh.approx, __expf, "
                        "__fdividef, ...) or 'precise' (the CUDA math library) (default: approx)")
    b.add_argument("--link", choices=("whole", "lto", "check"), default="whole",
                   help="cuda: 'whole' compiles templates and hooks as one program; 'lto' links the hooks into "
                        "template objects cached per hook signature (seconds per hook edit); 'check' compiles "
                        "the kernels' device code for every arch and makes no library (default: whole)")
    b.add_argument("--link-alternatives", action="store_true",
                   help="--link lto: also link up front the templates the runtime takes on an arch only when a "
                        "plan asks for them (sm_90a: the CUDA-core decode, the mma.sync prefill); by default "
                        "they are linked on first use")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="attngen", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="compile a variant into a shared library (cpu or cuda)",
                       description="Run the pipeline validate -> analyze -> schedule -> lower_hooks -> "
                                   "instantiate -> compile, reusing the build cache when nothing changed.")
    _add_source(b)
    _add_config(b)
    b.add_argument("--out", type=Path, help="also copy the artifacts into this directory")
    b.add_argument("--cache-dir", type=Path, help="build cache location (default: $ATTNGEN_CACHE_DIR or ~/.cache/attngen)")
    b.add_argument("--dump", type=Path, help="write every stage's artifact under this directory (same as ATTNGEN_DUMP)")

    i = sub.add_parser("inspect", help="show a variant's hooks, analysis results and generated CUDA device code")
    _add_source(i)
    i.add_argument("--head-dim", type=int, default=128, help="head dim to specialise row hooks for (default: 128)")
    i.add_argument("--arch", default="sm_80", help="arch to generate CUDA for (default: sm_80)")
    i.add_argument("--hook-math", choices=HOOK_MATH_MODES, default="approx",
                   help="the hooks' float math in the CUDA shown (default: approx)")

    pb = sub.add_parser("prebuild", help="fill a build cache ahead of time (e.g. to ship read-only with a deployment)",
                        description="Build the named variants (default: every built-in) for the given configuration "
                                    "into a cache. With --link lto the template objects of their hook signatures "
                                    "are cached too, so a user variant with the same signature builds in seconds. "
                                    "Point ATTNGEN_PREBUILT_DIRS at the filled cache (read-only is fine) to use it.")
    pb.add_argument("--variants", type=_csv, default=(), help="comma-separated built-in names (default: all)")
    _add_config(pb)
    pb.add_argument("--cache-dir", type=Path, help="the cache to fill (default: $ATTNGEN_CACHE_DIR or ~/.cache/attngen)")

    sub.add_parser("list", help="list the built-in variants")
    return ap


def _request_source(source: str, variant: str | None) -> dict | None:
    """The variant the command line names, as text: a built-in's name, or a file's path and content
    hash; None for a path that is no file (the pipeline's loader reports it)."""
    path = Path(source)
    if path.suffix != ".py":
        return {"builtin": source, "variant": variant}
    if not path.is_file():
        return None
    return {"file": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "variant": variant}


def _finished_build(cache: BuildCache, request: str, cfg: BuildConfig, t0: float):
    """The result of an earlier build of the same request, if its cache entry and the user's modules it
    imported are unchanged; None otherwise."""
    from attngen.codegen.pipeline import BuildResult

    seen = cache.read_record(request)
    if seen is None or not entry_is_sealed(cache.path_for(seen["entry"])):  # a damaged entry is built again
        return None
    return BuildResult.from_entry(seen["variant"], cfg, cache.path_for(seen["entry"]), True,
                                  time.perf_counter() - t0)


def _announce(name: str, cfg: BuildConfig) -> None:
    what = f"variant '{name}' for {cfg.target}"
    if cfg.target == "cuda":
        what += f" ({', '.join(cfg.archs)})"
    kv = f", kv_dtype {list(cfg.kv_dtypes)}" if cfg.kv_dtypes != cfg.dtypes else ""
    print(f"attngen: building {what}: head_dim {list(cfg.head_dims)}, dtype {list(cfg.dtypes)}{kv}, "
          f"layouts {list(cfg.layouts)}")


class _NoTorchInTvmImport(importlib.abc.MetaPathFinder):
    """Refuses ``import torch`` while tvm_ffi or tvm initialise: both import torch eagerly where it is installed
    (for their DLPack interop: 2.5 of the 5 s ``import tvm`` takes on a 2-core machine) and take an ImportError
    as "no torch". The commands that build and inspect never touch a tensor; torch stays importable for anything
    else (a variant file may use it; TVM then takes torch tensors through the standard DLPack protocol)."""

    def find_spec(self, name, path=None, target=None):
        tvm = sys.modules.get("tvm")
        if tvm is not None and not getattr(getattr(tvm, "__spec__", None), "_initializing", False):
            sys.meta_path.remove(self)  # TVM is imported: nothing left to do
            return None
        if name == "torch" and any(getattr(getattr(sys.modules.get(m), "__spec__", None), "_initializing", False)
                                   for m in ("tvm_ffi", "tvm")):
            raise ModuleNotFoundError("torch is not imported while TVM initialises for attngen's build", name="torch")
        return None


def _skip_torch_in_tvm_import() -> None:
    """Install the finder where neither TVM nor torch is imported yet (a process that has torch keeps it for TVM)."""
    if not {"tvm", "tvm_ffi", "torch"} & set(sys.modules) and \
            not any(isinstance(f, _NoTorchInTvmImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoTorchInTvmImport())


def cmd_build(args) -> int:
    from attngen.codegen.pipeline import PACKAGE, request_key

    _check_directories(args)
    _constants(args)  # (refused before a finished build is looked for)
    cfg = _config(args)
    cache = BuildCache(args.cache_dir) if args.cache_dir else BuildCache()
    t0 = time.perf_counter()
    source = _request_source(args.source, args.variant)
    if source is not None and args.constant:
        source["constants"] = sorted(args.constant)
    request = request_key(source, cfg) if source is not None else None
    res = None
    # a dump asks for every stage's artifact, which only running the stages gives
    if request is not None and not (args.dump or os.environ.get("ATTNGEN_DUMP")):
        res = _finished_build(cache, request, cfg, t0)
    if res is not None:
        _announce(res.variant, cfg)
    else:
        from attngen.build import build
        from attngen.codegen.cache import local_module_files

        variant = _load_variant(args)
        _announce(variant.name, cfg)
        res = build(variant, cfg, cache=cache, dump=args.dump, log=print)
        if request is not None:
            cache.write_record(request, {"variant": variant.name, "entry": res.directory.name},
                               depends_on=local_module_files(exclude=(PACKAGE,)))
    print(f"attngen: {'cache hit' if res.cache_hit else 'compiled'} in {res.seconds:.2f}s -> {res.directory}")
    for f in res.manifest.get("functions", []):
        print(f"  function {f}")
    for o in res.objects:
        print(f"  object {o.name}")
    if res.library:
        print(f"attngen: library {res.library}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for f in res.directory.iterdir():
            shutil.copy2(f, args.out / f.name)
        print(f"attngen: artifacts copied to {args.out}")
    return 0


def _config(args) -> BuildConfig:
    if args.target == "cpu":
        _check_cpu_options(args)
    dtypes = args.dtype or (("float32",) if args.target == "cpu" else ("float16",))
    return BuildConfig(target=args.target, head_dims=args.head_dim, dtypes=dtypes, kv_dtypes=args.kv_dtype,
                       archs=args.arch, layouts=args.layout, fast_math=args.fast_math, kernels=args.kernels,
                       max_group_size=args.max_group_size, hook_math=args.hook_math, link=args.link,
                       defer_alternatives=not args.link_alternatives)


def _check_cpu_options(args) -> None:
    """The cuda-only options are refused for a cpu build, which would ignore them."""
    if args.arch:
        raise ConfigError(f"--arch {','.join(args.arch)} is for cuda builds; add --target cuda (the default target "
                          "is cpu)")
    if set(args.kernels) != set(DEFAULT_KERNELS):
        raise ConfigError(f"--kernels {','.join(args.kernels) or 'none'} selects cuda templates; add --target cuda "
                          "(the CPU backend always builds decode and prefill)")


def cmd_prebuild(args) -> int:
    from attngen.build import build, support_library
    from attngen.variants import BUILTINS, builtin

    _check_directories(args)
    cfg = _config(args)
    cache = BuildCache(args.cache_dir, prebuilt=()) if args.cache_dir else BuildCache(prebuilt=())
    names = args.variants or tuple(BUILTINS)
    unknown = [n for n in names if n not in BUILTINS]
    if unknown:
        raise ConfigError(f"--variants: {unknown} are not built-in variants; see 'attngen list'")
    t0 = time.perf_counter()
    for name in names:
        res = build(builtin(name), cfg, cache=cache)
        print(f"attngen prebuild: {name}: {'cached' if res.cache_hit else 'built'} in {res.seconds:.1f}s")
        if res.manifest.get("deferred"):  # the templates its runtime compiles on first use, compiled now
            from attngen.codegen.lto import deferred_template

            for entry in res.manifest["deferred"]:
                deferred_template(res.directory, res.manifest, entry, cache)
    # what the runtime loads besides: the planner, and the merges (CUDA: one library per arch, as it asks for them)
    merges = [("merge_cpu", ())] if cfg.target == "cpu" else [("merge_cuda", (a,)) for a in cfg.archs]
    for kind, archs in [("planner", ()), *merges]:
        support_library(kind, archs=archs, cache=cache)
        print(f"attngen prebuild: support library {kind}{' ' + archs[0] if archs else ''}")
    print(f"attngen prebuild: {len(names)} variants in {time.perf_counter() - t0:.1f}s into {cache.root}; use it "
          f"with {PREBUILT_ENV}={cache.root}")
    return 0


def cmd_inspect(args) -> int:
    from attngen.codegen.hooks_cuda import lower_hooks_cuda
    from attngen.ir import HOOKS, StateAlgebra
    from attngen.schedules.template_prefill_hopper import PREFILL_HOPPER, hopper_config_for

    args.arch = _inspect_target(args)
    v = _load_variant(args)
    print(f"# variant {v.name}  (state: {v.state.value}; defined at {v.defined_at})")
    if v.doc:
        print(f"# {v.doc}")
    print("\n## parameters")
    print("  sm_scale: float32 (always; default 1/sqrt(head_dim))")
    for p in v.params:
        print(f"  {p}")
    for name, value in v.constants.items():
        print(f"  {name} = {value!r}: compiled in (folded into the hooks)")
    print("\n## hooks")
    if not v.hooks:
        print("  (none: vanilla softmax attention)")
    for name, func in v.hooks.items():
        print(f"### {name} — applied {HOOKS[name].applied}")
        print(func.script())
    print("## analysis")
    print(v.analysis.describe())
    hs = lower_hooks_cuda(v, args.head_dim, args.arch, args.hook_math)
    if hs.logits_split:
        ls = hs.logits_split["split"]
        how = "reassociated (approximate hook math), then hoisted" if ls.reassociated else "hoisted (precise math)"
        print(f"\n## logits hook in the prefill templates: row terms {how}")
        print("  once per query row: scale = sm_scale, post = log2 e for a base-2 softmax (else 1)")
        for i, term in enumerate(ls.terms):
            print(f"    rt[{i}] = {term}")
        print(f"  per score, s the raw q.k: {ls.score.body.value}")
        if ls.affine:
            print("  affine (rt[0] * s + rt[1] * kv_pos_f + rt[2]): on interior tiles of warps whose rows all have "
                  "rt[0] > 0, one FFMA per score, rt[0] and the key term folded into the exponent")
        if ls.post_scale >= 0 and v.state == StateAlgebra.SOFTMAX:
            k = ls.post_scale
            print(f"  post-scaled (g * rt[{k}]): on interior tiles of warps whose rows all have a finite "
                  f"rt[{k}] > 0, the row max taken of g and rt[{k}] folded into the exponent's FFMA (one multiply "
                  "less per score)")
            if ls.post_bounded:
                print(f"  bounded (g a tanh, |logit| <= rt[{k}]): over bf16, warps whose rows "
                      f"all have rt[{k}] <= 80 fix the row max at 0: no row max and no rescale on interior tiles")
        if ls.float_positions:
            print("  kv_pos_f: the key position as a float32, counted up per tile (exact below 2^23 keys; "
                  "plan_prefill refuses longer requests)")
    if hs.mask_split:
        ms = hs.mask_split["split"]
        print("\n## mask hook in the prefill templates' checked tiles: row-invariant reads hoisted")
        for i, term in enumerate(ms.terms):
            print(f"    rt[{i}] = {term}  (once per query row; 0 outside the tensor's bounds)")
        reads, rest = ms.per_score()
        for var, read in reads:
            print(f"    {var} = {read}  (per key, before the tests, inside the tensor's bounds)")
        print(f"  per score: {rest}")
        if ms.key is not None:
            print(f"  key term: {ms.key.body.value}  (compared with rt[{ms.key_of}]: the tile-map classifier skips a "
                  "tile whose keys' and rows' ranges of the two share no value)")
    keys, queries = row_hooks(v)
    if keys or queries:
        from attngen.runtime.hook_pass import AUTO_MIN_ROWS

        which = " and ".join(n for n, has in (("key", keys), ("query", queries)) if has)
        print(f"\n## {which} transform in prefill: the row-hook pass (csrc/hook_pass.cuh)")
        if keys:
            print(f"  plan_prefill(hook_pass=None): applied once per row ahead of the kernels (into a workspace) when a "
                  f"request spans {AUTO_MIN_ROWS} or more packed query rows; else on every K/V tile (the key "
                  "transform) / every query tile (the query transform); hook_pass=True / False forces either")
        else:
            print("  plan_prefill(hook_pass=True): applied once per row ahead of the kernels; by default per query "
                  "tile in the kernels (it runs once per row there too)")
        print("  fp8 caches and the TVM slots: in the kernels")
    if args.arch == "sm_90a" and args.head_dim in PREFILL_HOPPER.head_dims:
        tile = hopper_config_for(v, args.head_dim)
        print(f"\n## Hopper prefill tiles (sm_90a, 16-bit caches): {tile.rows} packed query rows x {tile.keys} keys, "
              f"{tile.stages} K/V stages, {tile.q_buffers} query buffer{'s' if tile.q_buffers > 1 else ''}")
        if tile.wide:
            print("  wide: no mask hook or key transform checks a score (fp8 caches keep 128 keys)")
    print(f"\n## generated CUDA device code (head_dim {args.head_dim}, {args.arch})")
    print(hs.code)
    return 0


def _inspect_target(args) -> str:
    """inspect's --arch by its name in the arch table (sm_90 is sm_90a), and --head-dim among the head dims
    some build serves."""
    if args.head_dim not in INSPECT_HEAD_DIMS:
        raise ConfigError(f"--head-dim {args.head_dim}: attngen builds head dims {list(INSPECT_HEAD_DIMS)}; "
                          "inspect one of those")
    return arch_spec(args.arch).name


def cmd_list(args) -> int:
    from attngen.builtin_listing import compute_rows, shipped_rows

    rows = shipped_rows()  # the package's own table, while its key holds: no TVM to import
    if rows is None:
        from attngen.codegen.pipeline import PACKAGE, package_files

        # else the table, a function of attngen's sources (the built-ins, their analyses) and the installed TVM,
        # computed once into the build cache
        cache = BuildCache()
        key = content_key({"listing": hash_files(package_files(), root=PACKAGE), "python": python_environment()})
        seen = cache.read_record(key)
        if seen is None:
            seen = {"rows": compute_rows()}
            cache.write_record(key, seen)
        rows = seen["rows"]
    for name, mask, doc in rows:
        print(f"{name:24s} {mask:15s} {doc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command in ("build", "inspect", "prebuild"):
        _skip_torch_in_tvm_import()
    try:
        return {"build": cmd_build, "inspect": cmd_inspect, "list": cmd_list, "prebuild": cmd_prebuild}[args.command](args)
    except (VariantError, ConfigError, NvccError, OSError, ValueError) as e:
        print(f"attngen: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        errors = sys.modules.get("tvm.error")  # a TVM error means TVM was imported
        if errors is None or not isinstance(e, (errors.DiagnosticError, errors.InternalError)):
            raise
        from attngen.loader import diagnostic_text

        # TVM failed where attngen did not expect it; its message is all there is to go on
        print(f"attngen: error: TVM: {diagnostic_text(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
