"""Link-time builds (``BuildConfig.link="lto"``): templates compiled once, a variant's hooks linked in.

Three kinds of pieces, each in the build cache under its own key:

- a **template object** per (template record, arch, head dim, dtype pair, group bound, hook signature):
  the record's launcher instantiated over the ABI traits (:func:`.cuda_variant.abi_traits_source`,
  whose text is the signature: which hooks exist, their per-element forms, the state algebra, scale
  folding, the mask's bounds), compiled by ``nvcc -dc`` to LTO-IR (``code=lto_XX``). Its kernels take
  the variant's parameters as an ``attngen::ParamBlock`` (csrc/hook_abi.h) and call each hook as an
  extern "C" device function, so every variant of that signature shares it. Beside it, its kernels'
  table: key (``decode_kernel<__half, 128, 4>``) -> mangled name.
- a **host glue object** per parameter list and signature: the exported TVM-FFI entries over
  ``LinkedHooks_d<D>`` (the variant's FFI parameters packed into the block), whose launchers take the
  kernels by name from the linked cubin (csrc/cubin_launch.h). A hook body's edit leaves it as it is.
- per variant, its **hook object** (the lowered hooks and the ABI functions reading the block as the
  variant's Params; ``nvcc -dc`` to LTO-IR), the **cubin** per arch (nvJitLink ``-lto`` of the hook
  object with the template objects: the hooks inline into the kernels), and the library: the host glue
  linked with the embedded cubins and kernel table.

``stats`` counts the template and host-glue objects built and reused in this process (tests and logs).
"""
from __future__ import annotations

import functools
import re
import struct
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi.libinfo

import attngen
from attngen.ir import ConfigError
from attngen.schedules.arch import arch_spec
from attngen.schedules.build_config import BuildConfig
from attngen.schedules.dtypes import DtypePair
from attngen.schedules.ffi_enums import enums_header
from attngen.schedules.registry import selected
from attngen.schedules.tile_header import HEADER_NAME, tiles_header

from . import nvcc, nvjitlink, nvrtc
from .cache import BuildCache, content_key, hash_files
from .cuda_entries import decode_wrapper, prefill_wrapper
from .cuda_variant import C_TYPES, abi_hooks_source, abi_traits_source, linked_host_traits_source
from .host_library import host_cxx

CSRC = Path(attngen.__file__).parent / "csrc"

stats: Counter = Counter()  # "template_built" / "template_reused" / "glue_built" / "glue_reused"


@dataclass(frozen=True)
class Launcher:
    """What a template record's object instantiates: the header holding its launcher and the explicit
    instantiations (``{V}``: the traits, ``{T}``: element type, ``{D}``, ``{G}``: the group bound) that
    reach every kernel the launcher may pick."""
    header: str
    instantiations: tuple[str, ...]


LAUNCHERS = {
    "decode": Launcher("decode_launch.cuh", (
        "template bool attngen::launch_decode<{V}, {T}, {D}, {G}>(const attngen::DecodeProblem&, "
        "const {V}::Params&, cudaStream_t);",)),
    "prefill": Launcher("prefill.cuh", (
        "template void attngen::launch_prefill<{V}, {T}, {D}>(const attngen::PrefillProblem&, int, "
        "const {V}::Params&, cudaStream_t);",)),
}


def check_config(cfg: BuildConfig) -> None:
    """Refuse what link-time builds do not serve (yet): templates without a launcher record here."""
    missing = [k for k in cfg.kernels if k not in LAUNCHERS]
    if missing:
        raise ConfigError(f"link='lto' builds serve the templates {sorted(LAUNCHERS)}; {missing} need "
                          "link='whole'")
    if not nvjitlink.available():
        nvjitlink._module()  # raises the LinkError naming the missing packages


def lto_gencode(arch: str) -> tuple[str, str]:
    """(nvcc -gencode for LTO-IR, nvJitLink's sm) of an arch name such as "sm_90a"."""
    sm = arch_spec(arch).name.removeprefix("sm_")
    return f"-gencode=arch=compute_{sm},code=lto_{sm}", sm


def _common_flags(cfg: BuildConfig, out: Path) -> tuple[str, ...]:
    return ("-std=c++17", "-O3", "-Xcompiler", "-fPIC", f"-I{CSRC}", f"-I{out}", "--expt-relaxed-constexpr",
            *(("--use_fast_math",) if cfg.fast_math else ()))


def _nvcc(cmd: list[str], what: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise nvcc.NvccError(f"{what} failed:\n$ {' '.join(cmd)}\n{p.stderr[-6000:]}")


@functools.lru_cache(maxsize=None)
def _csrc_hash() -> str:
    return hash_files(sorted(p for p in CSRC.iterdir() if p.is_file()), root=CSRC)


# ---- template objects ----

def template_source(record: str, head_dim: int, pair: DtypePair, max_group: int) -> str:
    launcher = LAUNCHERS[record]
    fill = {"V": f"attngen_gen::Hooks_d{head_dim}", "T": C_TYPES[pair.q], "D": head_dim, "G": max_group}
    return "\n".join([f'#include "abi_d{head_dim}.cuh"', f'#include "{launcher.header}"', '#include "tile_checks.h"',
                      *(i.format(**fill) for i in launcher.instantiations)]) + "\n"


def template_key(record: str, arch: str, head_dim: int, pair: DtypePair, cfg: BuildConfig, abi: str) -> str:
    """The cache key of one template object: everything its LTO-IR depends on, and nothing of the
    variant beyond its hook signature (``abi``, the ABI traits' text)."""
    return content_key({"lto_template": record, "source": template_source(record, head_dim, pair, cfg.max_group_size),
                        "arch": arch, "head_dim": head_dim, "dtypes": [pair.q, pair.kv],
                        "max_group": cfg.max_group_size if record == "decode" else 0, "abi": abi,
                        "fast_math": cfg.fast_math, "csrc": _csrc_hash(), "tiles": tiles_header(),
                        "enums": enums_header(), "nvcc": nvcc.nvcc_version(), "attngen": attngen.__version__})


def template_object(record: str, arch: str, head_dim: int, pair: DtypePair, cfg: BuildConfig, abi: str,
                    cache: BuildCache) -> Path:
    """The template object, built once per key."""
    key = template_key(record, arch, head_dim, pair, cfg, abi)
    gencode, _ = lto_gencode(arch)

    def build(out: Path) -> None:
        (out / f"abi_d{head_dim}.cuh").write_text(abi)
        (out / "attngen_enums.h").write_text(enums_header())
        (out / HEADER_NAME).write_text(tiles_header())
        src = out / "template.cu"
        src.write_text(template_source(record, head_dim, pair, cfg.max_group_size))
        obj = out / "template.o"
        _nvcc([nvcc.require_nvcc(), gencode, *_common_flags(cfg, out), "-dc", str(src), "-o", str(obj)],
              f"nvcc of the {record} template (LTO-IR, {arch}, d{head_dim})")

    directory, hit = cache.get_or_build(key, build)
    stats["template_reused" if hit else "template_built"] += 1
    return directory / "template.o"


def cubin_section_names(cubin: bytes) -> list[str]:
    """The section names of an ELF64 cubin."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def header(i):  # (name offset, offset, size)
        base = shoff + i * shentsize
        return struct.unpack_from("<I", cubin, base)[0], *struct.unpack_from("<QQ", cubin, base + 0x18)

    _, str_off, str_size = header(shstrndx)
    strtab = cubin[str_off:str_off + str_size]
    return [strtab[n:strtab.index(b"\0", n)].decode() for n, _, _ in (header(i) for i in range(shnum))]


def cubin_kernels(cubin: bytes) -> list[str]:
    """Mangled names of a cubin's kernels (each has its ``.nv.info.<name>`` section)."""
    prefix = ".nv.info."
    return sorted(n[len(prefix):] for n in cubin_section_names(cubin) if n.startswith(prefix + "_Z"))


def kernel_table(mangled: list[str]) -> dict[str, str]:
    """Key -> mangled name of each kernel, demangled by c++filt: the key is the kernel's unqualified
    name with its template arguments after the first (the traits), e.g. ``decode_kernel<__half, 128, 4>``
    (csrc/cubin_launch.h builds the same string)."""
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                               check=True).stdout.splitlines()
    return {kernel_key(d): m for m, d in zip(mangled, demangled)}


def kernel_key(demangled: str) -> str:
    """``void attngen::decode_kernel<attngen_gen::Hooks_d128, __half, 128, 4>(...)`` ->
    ``decode_kernel<__half, 128, 4>``."""
    m = re.match(r"(?:void )?(?:[\w:]+::)?(\w+)<", demangled)
    if not m:
        raise ValueError(f"not a kernel template instance: {demangled!r}")
    depth, args, cur = 0, [], ""
    for ch in demangled[m.end():]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    args.append(cur.strip())
    return f"{m.group(1)}<{', '.join(args[1:])}>"


# ---- host glue ----

def _entries(record: str, cfg: BuildConfig, head_dim: int, pair: DtypePair) -> list[str]:
    traits = f"attngen_gen::LinkedHooks_d{head_dim}"
    if record == "decode":
        return [decode_wrapper(head_dim, pair.q, lay, cfg.max_group_size, traits=traits) for lay in cfg.layouts]
    return [prefill_wrapper(head_dim, pair.q, lay, traits=traits) for lay in (None, *cfg.layouts)]


def glue_source(cfg: BuildConfig, head_dim: int, record_headers: dict[str, tuple[str, ...]]) -> str:
    """One host TU of one head dim: its traits headers, the records' entry headers, the exports."""
    parts = [f'#include "abi_d{head_dim}.cuh"', f'#include "linked_d{head_dim}.cuh"', '#include "problem_glue.h"']
    for headers in record_headers.values():
        parts += [f'#include "{h}"' for h in headers]
    parts.append('#include "tile_checks.h"')
    for record in record_headers:
        for pair in cfg.dtype_pairs:
            parts += _entries(record, cfg, head_dim, pair)
    return "\n".join(parts) + "\n"


def glue_object(variant, cfg: BuildConfig, head_dim: int, abi: str, linked: str, cache: BuildCache) -> Path:
    """The host glue of one head dim, keyed by its sources (the ABI traits and the variant's parameter
    list, never a hook body), so that editing a hook reuses it."""
    record_headers = {r.name: r.headers for r in selected(cfg.kernels)}
    src_text = glue_source(cfg, head_dim, record_headers)
    li = tvm_ffi.libinfo
    key = content_key({"lto_glue": src_text, "abi": abi, "linked": linked, "csrc": _csrc_hash(),
                       "tiles": tiles_header(), "enums": enums_header(), "nvcc": nvcc.nvcc_version(),
                       "host_cxx": host_cxx()[1], "tvm_ffi": tvm_ffi.__version__, "attngen": attngen.__version__})

    def build(out: Path) -> None:
        (out / f"abi_d{head_dim}.cuh").write_text(abi)
        (out / f"linked_d{head_dim}.cuh").write_text(linked)
        (out / "attngen_enums.h").write_text(enums_header())
        (out / HEADER_NAME).write_text(tiles_header())
        src = out / "glue.cu"
        src.write_text(src_text)
        # no kernel is instantiated here: the device pass has nothing to compile for the one arch named
        gencode, _ = lto_gencode(cfg.archs[0])
        _nvcc([nvcc.require_nvcc(), gencode.replace("code=lto_", "code=compute_"), *_common_flags(cfg, out),
               f"-I{li.find_include_path()}", f"-I{li.find_dlpack_include_path()}", "-c", str(src),
               "-o", str(out / "glue.o")], f"nvcc of the host glue (d{head_dim})")

    directory, hit = cache.get_or_build(key, build)
    stats["glue_reused" if hit else "glue_built"] += 1
    return directory / "glue.o"


# ---- the variant's part ----

def hook_unit(variant, cfg: BuildConfig, arch: str, lowered: dict) -> str:
    """The hook object's source for one arch: the lowered hooks (their headers, written by the
    instantiate stage) and the ABI functions of every head dim."""
    parts = ["// The variant's hooks behind the link-time ABI (csrc/hook_abi.h)."]
    for d in cfg.head_dims:
        parts.append(f'#include "hooks_{variant.name}_d{d}_{arch}.cuh"')
        parts.append(abi_hooks_source(variant, lowered[(arch, d)], d))
    return "\n".join(parts) + "\n"


@functools.lru_cache(maxsize=None)
def cuda_include_dirs() -> tuple[Path, ...]:
    """The CUDA toolkit's header directories, as nvcc names them (nvcc may be a wrapper script)."""
    out = subprocess.run([nvcc.require_nvcc(), "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"],
                         capture_output=True, text=True).stderr
    m = re.search(r'INCLUDES="([^"]*)"', out)
    return tuple(Path(d) for d in re.findall(r"-I(\S+)", m.group(1).replace('"', ""))) if m else ()


def compile_hooks(out: Path, cfg: BuildConfig, arch: str, source: str) -> Path:
    """The hook object (LTO-IR) of one arch: by NVRTC in-process where it is installed (about 0.03 s
    here), else by ``nvcc -dc`` (about 0.9 s, mostly the process's start)."""
    src = out / f"abi_hooks_{arch}.cu"
    src.write_text(source)
    gencode, sm = lto_gencode(arch)
    if nvrtc.available():
        obj = out / f"abi_hooks_{arch}.ltoir"
        obj.write_bytes(nvrtc.compile_ltoir(source, src.name, sm, [out, CSRC, *cuda_include_dirs()], cfg.fast_math))
        return obj
    obj = out / f"abi_hooks_{arch}.o"
    _nvcc([nvcc.require_nvcc(), gencode, *_common_flags(cfg, out), "-dc", str(src), "-o", str(obj)],
          f"nvcc of the hooks (LTO-IR, {arch})")
    return obj


def _link_object_source(cubins: list[tuple[Path, int]], table: dict[str, str]) -> str:
    """C source embedding the cubins and the kernel table (hidden: each library keeps its own)."""
    lines = ['#define HIDDEN __attribute__((visibility("hidden")))']
    for i, (path, _) in enumerate(cubins):
        lines.append(f'__asm__(".section .rodata\\n.balign 128\\nattngen_cubin_{i}:\\n'
                     f'.incbin \\"{path}\\"\\n.byte 0\\n.previous\\n");')
        lines.append(f"extern const unsigned char attngen_cubin_{i}[];")
    lines.append("struct AttngenLinkedCubin { const unsigned char* data; int sm; };")
    rows = "".join(f"{{attngen_cubin_{i}, {sm}}}, " for i, (_, sm) in enumerate(cubins))
    lines.append(f"HIDDEN const struct AttngenLinkedCubin attngen_linked_cubins[] = {{{rows}{{0, 0}}}};")
    pairs = "".join(f'  "{k}", "{m}",\n' for k, m in sorted(table.items()))
    lines.append(f"HIDDEN const char* const attngen_linked_kernels[] = {{\n{pairs}  0}};")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def _cudart_static() -> Path:
    from .cuda_object import cudart_static
    return cudart_static()


def _sm_number(sm: str) -> int:
    return int(re.match(r"\d+", sm).group())


def build_linked_library(ctx, cache: BuildCache | None = None) -> dict:
    """The link-time build of ``ctx`` (the CUDA backend's compile stage with link="lto"): the manifest's
    entries, with the seconds each step took and which cached objects were reused."""
    cache = cache or ctx.cache or BuildCache()
    variant, cfg, out = ctx.variant, ctx.config, ctx.out_dir
    lowered = ctx.artifacts["lower_hooks"]
    timings, reused = {}, {"templates": [], "glue": []}
    t = time.perf_counter()
    first = cfg.archs[0]
    abi = {d: abi_traits_source(variant, lowered[(first, d)], d) for d in cfg.head_dims}
    objects, table = {a: [] for a in cfg.archs}, {}
    for a in cfg.archs:
        for record in selected(cfg.kernels):
            for d in cfg.head_dims:
                for pair in cfg.dtype_pairs:
                    before = stats["template_reused"]
                    objects[a].append(template_object(record.name, a, d, pair, cfg, abi[d], cache))
                    reused["templates"].append(stats["template_reused"] > before)
    timings["templates"] = time.perf_counter() - t

    t = time.perf_counter()
    glue = []
    for d in cfg.head_dims:
        before = stats["glue_reused"]
        glue.append(glue_object(variant, cfg, d, abi[d], linked_host_traits_source(variant, lowered[(first, d)], d),
                                cache))
        reused["glue"].append(stats["glue_reused"] > before)
    timings["glue"] = time.perf_counter() - t

    t = time.perf_counter()
    hook_objects = {a: compile_hooks(out, cfg, a, hook_unit(variant, cfg, a, lowered)) for a in cfg.archs}
    timings["hooks"] = time.perf_counter() - t

    t = time.perf_counter()
    cubins = []
    for a in cfg.archs:
        _, sm = lto_gencode(a)
        cubin = out / f"linked_{a}.cubin"
        data = nvjitlink.link_cubin([hook_objects[a], *objects[a]], sm, cfg.fast_math)
        cubin.write_bytes(data)
        cubins.append((cubin, _sm_number(sm)))
        kernels = kernel_table(cubin_kernels(data))
        if table and kernels != table:
            raise RuntimeError(f"the cubins of {cfg.archs} hold different kernels: {sorted(kernels)} vs {sorted(table)}")
        table = kernels
    timings["link_cubin"] = time.perf_counter() - t

    t = time.perf_counter()
    link_src = out / "linked_cubins.c"
    link_src.write_text(_link_object_source(cubins, table))
    cxx = host_cxx()[0]
    _nvcc([cxx, "-x", "c", "-c", "-fPIC", str(link_src), "-o", str(out / "linked_cubins.o")],
          "the embedded cubins' object")
    lib = out / f"lib{variant.name}_cuda.so"
    ffi_lib = Path(tvm_ffi.libinfo.find_libtvm_ffi())
    _nvcc([cxx, "-shared", "-o", str(lib), *map(str, glue), str(out / "linked_cubins.o"), str(_cudart_static()),
           "-ldl", "-lpthread", "-lrt", f"-L{ffi_lib.parent}", "-ltvm_ffi", f"-Wl,-rpath,{ffi_lib.parent}"],
          "the link of the library")
    timings["link_library"] = time.perf_counter() - t
    return {"library": lib.name, "link": "lto", "objects": [o.name for o in hook_objects.values()], "cubins": [c.name for c, _ in cubins],
            "lto_seconds": {k: round(v, 3) for k, v in timings.items()}, "lto_reused": reused,
            "kernels": sorted(table)}
