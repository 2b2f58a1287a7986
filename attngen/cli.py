"""The ``attngen`` command line: build a variant, inspect what attngen made of it, list built-ins."""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import tvm.error

from attngen.build import build
from attngen.codegen.cache import BuildCache
from attngen.codegen.hooks_cuda import lower_hooks_cuda
from attngen.codegen.nvcc import NvccError
from attngen.ir import HOOKS, ConfigError, VariantError
from attngen.loader import diagnostic_text, pick_variant
from attngen.schedules import ARCHS, BuildConfig
from attngen.schedules.build_config import HOOK_MATH_MODES
from attngen.schedules.registry import KERNELS
from attngen.schedules.template_decode import GROUP_TILES
from attngen.variants import BUILTINS, builtin

DESCRIPTION = """\
attngen compiles attention variants written as TVM TensorIR hooks.

  attngen build examples/logits_softcap.py --target cpu --head-dim 64
  attngen build causal --target cuda --arch sm_80,sm_90a --head-dim 128 --dtype float16
  attngen inspect examples/logits_softcap.py
  attngen list
"""


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a Python file defining a Variant, or a built-in variant name (see 'attngen list')")
    p.add_argument("--variant", help="which variant, when the file defines several")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="attngen", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="compile a variant into a library (cpu) or device objects (cuda)",
                       description="Run the pipeline validate -> analyze -> schedule -> lower_hooks -> "
                                   "instantiate -> compile, reusing the build cache when nothing changed.")
    _add_source(b)
    b.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: a shared library of TVM-FFI attention functions built by LLVM; "
                        "cuda: the hooks lowered to CUDA and compiled with nvcc per arch (default: cpu)")
    b.add_argument("--arch", type=_csv, default=(),
                   help=f"cuda only: comma-separated archs among {', '.join(ARCHS)}")
    b.add_argument("--head-dim", type=lambda s: tuple(int(x) for x in _csv(s)), default=(128,),
                   help="comma-separated head dims to instantiate (default: 128)")
    b.add_argument("--dtype", type=_csv, default=None,
                   help="comma-separated query/output dtypes (cpu default float32; cuda default float16)")
    b.add_argument("--kv-dtype", type=_csv, default=(),
                   help="comma-separated K/V dtypes, one per --dtype (default: each query dtype; only K/V in "
                        "the query dtype are built today)")
    b.add_argument("--layout", type=_csv, default=("NHD", "HND"),
                   help="paged-KV layouts to instantiate: NHD, HND (default: both)")
    b.add_argument("--kernels", type=lambda s: () if s == "none" else _csv(s), default=("decode", "prefill"),
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
    b.add_argument("--link", choices=("whole", "lto"), default="whole",
                   help="cuda: 'whole' compiles templates and hooks as one program; 'lto' links the hooks into "
                        "template objects cached per hook signature (seconds per hook edit) (default: whole)")
    b.add_argument("--out", type=Path, help="also copy the artifacts into this directory")
    b.add_argument("--cache-dir", type=Path, help="build cache location (default: $ATTNGEN_CACHE_DIR or ~/.cache/attngen)")
    b.add_argument("--dump", type=Path, help="write every stage's artifact under this directory (same as ATTNGEN_DUMP)")

    i = sub.add_parser("inspect", help="show a variant's hooks, analysis results and generated CUDA device code")
    _add_source(i)
    i.add_argument("--head-dim", type=int, default=128, help="head dim to specialise row hooks for (default: 128)")
    i.add_argument("--arch", default="sm_80", help="arch to generate CUDA for (default: sm_80)")
    i.add_argument("--hook-math", choices=HOOK_MATH_MODES, default="approx",
                   help="the hooks' float math in the CUDA shown (default: approx)")

    sub.add_parser("list", help="list the built-in variants")
    return ap


def cmd_build(args) -> int:
    variant = pick_variant(args.source, args.variant)
    dtypes = args.dtype or (("float32",) if args.target == "cpu" else ("float16",))
    cfg = BuildConfig(target=args.target, head_dims=args.head_dim, dtypes=dtypes, kv_dtypes=args.kv_dtype,
                      archs=args.arch, layouts=args.layout, fast_math=args.fast_math, kernels=args.kernels,
                      max_group_size=args.max_group_size, hook_math=args.hook_math, link=args.link)
    what = f"variant '{variant.name}' for {cfg.target}"
    if cfg.target == "cuda":
        what += f" ({', '.join(cfg.archs)})"
    print(f"attngen: building {what}: head_dim {list(cfg.head_dims)}, dtype {list(cfg.dtypes)}, "
          f"layouts {list(cfg.layouts)}")
    res = build(variant, cfg, cache=BuildCache(args.cache_dir) if args.cache_dir else None, dump=args.dump,
                log=print)
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


def cmd_inspect(args) -> int:
    v = pick_variant(args.source, args.variant)
    print(f"# variant {v.name}  (state: {v.state.value}; defined at {v.defined_at})")
    if v.doc:
        print(f"# {v.doc}")
    print("\n## parameters")
    print("  sm_scale: float32 (always; default 1/sqrt(head_dim))")
    for p in v.params:
        print(f"  {p}")
    print("\n## hooks")
    if not v.hooks:
        print("  (none: vanilla softmax attention)")
    for name, func in v.hooks.items():
        print(f"### {name} — applied {HOOKS[name].applied}")
        print(func.script())
    print("## analysis")
    print(v.analysis.describe())
    print(f"\n## generated CUDA device code (head_dim {args.head_dim}, {args.arch})")
    print(lower_hooks_cuda(v, args.head_dim, args.arch, args.hook_math).code)
    return 0


def cmd_list(args) -> int:
    for name in BUILTINS:
        v = builtin(name)
        print(f"{name:24s} {v.analysis.mask.kind.value:15s} {v.doc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"build": cmd_build, "inspect": cmd_inspect, "list": cmd_list}[args.command](args)
    except (VariantError, ConfigError, NvccError, FileNotFoundError, ValueError) as e:
        print(f"attngen: error: {e}", file=sys.stderr)
        return 2
    except (tvm.error.DiagnosticError, tvm.error.InternalError) as e:
        # TVM failed where attngen did not expect it; its message is all there is to go on
        print(f"attngen: error: TVM: {diagnostic_text(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
