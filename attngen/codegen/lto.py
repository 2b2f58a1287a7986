"""Link-time builds (``BuildConfig.link="lto"``): templates compiled once, a variant's hooks linked in.

Three kinds of pieces, each in the build cache under its own key:

- a **template object** per (template record, arch, head dim, dtype pair, group bound, hook signature):
  the record's launcher instantiated over the pair's K/V type (the query's, or an fp8 cache's, whose
  kernels dequantise with k_scale / v_scale) and the ABI traits (:func:`.cuda_variant.abi_traits_source`,
  whose text is the signature: which hooks exist, their per-element forms, the state algebra, scale
  folding, the mask's bounds), compiled by ``nvcc -rdc=true -fatbin`` to LTO-IR (``code=lto_XX``; device
  code alone, no host side). Its kernels take
  the variant's parameters as an ``attngen::ParamBlock`` (csrc/hook_abi.h) and call each hook as an
  extern "C" device function, so every variant of that signature shares it.
- the host glue in two parts (csrc/linked_entry.h): a **launch object** per hook signature (nvcc: the
  entry templates' argument checks and launchers over the block, taking the kernels by name from the
  linked cubin, csrc/cubin_launch.h), and the **exports** per parameter list (the host C++ compiler
  alone, about a second: the TVM-FFI functions, typed as in a whole-program build, packing the
  variant's parameters into the block). A hook body's edit leaves both as they are.
- per variant, its **hook object** (the lowered hooks and the ABI functions reading the block as the
  variant's Params; LTO-IR by NVRTC, or ``nvcc -dc`` without it), the **cubin** per arch (nvJitLink
  ``-lto`` of the hook object with the template objects: the hooks inline into the kernels), and the
  library: the host glue linked with the embedded cubins and their kernel table (key
  ``decode_kernel<__half, 128, 4, __nv_fp8_e4m3>``, the last argument the K/V type -> mangled name,
  :mod:`.linked_cubin`).

Parts the runtime takes on an arch only when a plan asks for them (:data:`ALTERNATIVE_PARTS`: on sm_90a the
CUDA-core decode and the mma.sync prefill) are deferred by default (``BuildConfig.defer_alternatives``): the
build neither compiles their template objects nor links them, and names them in the manifest;
:func:`link_deferred` compiles and links one when a plan first asks for it (runtime/deferred_parts.py).

``stats`` counts the cached pieces built and reused in this process (tests and logs). The library of a build
is put together by :mod:`.lto_library`.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import tvm_ffi.libinfo

import attngen
from attngen.ir import ConfigError
from attngen.ir.hook_spec import row_hooks
from attngen.ir.mask_class import mask_needs_map
from attngen.schedules.arch import arch_spec, smem_floor_define
from attngen.schedules.build_config import BuildConfig, symbol
from attngen.schedules.dtypes import DtypePair
from attngen.schedules.ffi_enums import enums_header
from attngen.schedules.registry import companion_macros, selected
from attngen.schedules.template_prefill_hopper import PREFILL_HOPPER
from attngen.schedules.tile_header import HEADER_NAME, tiles_header

from . import nvcc, nvjitlink, nvrtc
from .cache import BuildCache, content_key, entry_is_sealed
from .cuda_entries import SCALED_KV_HEADERS, decode_entry, kv_c_type, prefill_entry, prefill_kind
from .cuda_variant import C_TYPES, abi_hooks_source, flag_line, params_bytes
from .host_library import csrc_hash, host_cxx, nvcc_key
from .linked_cubin import cubin_kernels, kernel_table

CSRC = Path(attngen.__file__).parent / "csrc"

# how many template objects, launch objects and exports this process built and took from the cache:
# "template_built" / "template_reused", "launch_built" / ..., "exports_built" / ...
stats: Counter = Counter()


def count(kind: str, hit: bool) -> None:
    """Count one cached piece (``kind``: "template", "launch" or "exports") built or reused."""
    stats[f"{kind}_{'reused' if hit else 'built'}"] += 1


@dataclass(frozen=True)
class LinkedExport:
    """One exported function of a linked library: its name, its entry kind's own arguments (an alias of
    csrc/linked_entry.h) and the launch object's entry template instance (``{V}``: the traits, ``{N}``:
    the name array)."""
    name: str
    own: str
    entry: str

    @property
    def tag(self) -> str:
        return f"attngen_linked::tag_{self.name}"


def _decode_exports(cfg: BuildConfig, d: int, pair: DtypePair) -> list[LinkedExport]:
    own = "attngen::DecodeFP8OwnArgs" if pair.kv_scaled else "attngen::DecodeOwnArgs"
    return [LinkedExport(symbol(f"batch_decode_paged_{lay.lower()}", pair.q, d, pair.kv), own,
                         decode_entry("{V}", d, pair, lay, cfg.max_group_size, "{N}")) for lay in cfg.layouts]


def _prefill_exports(cfg: BuildConfig, d: int, pair: DtypePair) -> list[LinkedExport]:
    fp8 = "FP8" if pair.kv_scaled else ""
    return [LinkedExport(symbol(prefill_kind(lay), pair.q, d, pair.kv),
                         f"attngen::Prefill{'Ragged' if lay is None else 'Paged'}{fp8}OwnArgs",
                         prefill_entry("{V}", d, pair, lay, "{N}")) for lay in (None, *cfg.layouts)] + [  # None: ragged
        # the tile-map classifier (its kernel in the shared part, csrc/tile_map.cuh)
        LinkedExport(symbol("prefill_tile_map", pair.q, d, pair.kv), "attngen::TileMapOwnArgs",
                     f"attngen::TileMapEntry<{{V}}, {d}, {{N}}>")]


@dataclass(frozen=True)
class Launcher:
    """A template record's part in link-time builds: the header holding its launcher, the explicit
    instantiations (``{V}``: the traits, ``{T}``: element type, ``{KV}``: the cache's, ``{D}``, ``{G}``: the
    group bound) that reach every kernel the launcher may pick, and its exported functions (the record's
    exports, in the launch object's and the exports' terms). ``parts``: a line opening each template object the record is
    compiled into (one each: they link into cubins of their own, in parallel), each selecting its share of
    the kernels."""
    header: str
    instantiations: tuple[str, ...]
    exports: Callable[[BuildConfig, int, DtypePair], list[LinkedExport]]
    parts: tuple[str, ...] = ("",)
    # per part, the instantiations in place of ``instantiations`` (empty: those), and the companion
    # template's build macro a part needs (registry.companion_macros; None: always built)
    part_instantiations: tuple[tuple[str, ...], ...] = ()
    part_macros: tuple[str | None, ...] = ()
    # parts whose kernels do not depend on the dtype pair: compiled once per (arch, head dim), with the
    # build's first pair, and linked once
    shared_parts: tuple[int, ...] = ()
    # instantiations only 16-bit caches' entries reach: a whole-program unit of an fp8 pair leaves them out of
    # its device pass (its host glue never instantiates them)
    unscaled_only: tuple[str, ...] = ()

    def instantiations_of(self, part: int) -> tuple[str, ...]:
        return self.part_instantiations[part] if self.part_instantiations else self.instantiations

    def instances(self, part: int, head_dim: int, pair: DtypePair, max_group: int,
                  device_pass: bool = False) -> list[str]:
        """Part ``part``'s explicit instantiations over ``attngen_gen::Hooks_d<head_dim>`` (the link-time ABI
        traits in a template object, the variant's own traits in a whole-program unit's device pass:
        ``device_pass``, which for an fp8 pair leaves out ``unscaled_only``)."""
        fill = {"V": f"attngen_gen::Hooks_d{head_dim}", "T": C_TYPES[pair.q], "KV": kv_c_type(pair), "D": head_dim,
                "G": max_group}
        return [i.format(**fill) for i in self.instantiations_of(part)
                if not (device_pass and pair.kv_scaled and i in self.unscaled_only)]

    def parts_of(self, macros: list[str], first_pair: bool = True) -> list[int]:
        """The parts a build whose companion macros are ``macros`` compiles (for every arch alike: the
        kernel table is the same on each); ``first_pair``: for the build's first dtype pair (the shared
        parts are compiled with it alone)."""
        return [i for i in range(len(self.parts))
                if (not self.part_macros or self.part_macros[i] is None or self.part_macros[i] in macros)
                and (first_pair or i not in self.shared_parts)]


# the row-hook pass (csrc/hook_pass.cuh), which only 16-bit caches' prefill entries run
HOOK_PASS_INSTANCE = ("template void attngen::launch_hook_pass<{V}>(const attngen::HookPassProblem&, "
                      "const {V}::Params&, cudaStream_t);")

HOPPER_MACRO = PREFILL_HOPPER.build_macro  # the Hopper prefill's part of the prefill record

LAUNCHERS = {
    "decode": Launcher("decode_launch.cuh", (
        "template bool attngen::launch_decode<{V}, {T}, {D}, {G}, {KV}>(const attngen::DecodeProblemOf<{KV}>&, "
        "const {V}::Params&, cudaStream_t);",), _decode_exports,
        # the CUDA-core kernels; the tensor-core ones with the merge (csrc/decode_launch.cuh)
        ("#define ATTNGEN_DECODE_KERNELS 1", "#define ATTNGEN_DECODE_KERNELS 2")),
    "prefill": Launcher("prefill_dispatch.h", (), _prefill_exports,
        # the mma.sync kernels; the Hopper ones where the build has sm_90a (on its other archs they compile
        # to empty kernels, so that every arch's cubins hold the same kernels); the tile-map classifier
        # (csrc/tile_map.cuh: the mask hook alone, the same kernel for every dtype pair) and the row-hook pass
        # (csrc/hook_pass.cuh: the key / query hooks, the element type a flag)
        ("", f"#define {HOPPER_MACRO} 1", "// the tile-map classifier and the row-hook pass"), (
            ("template void attngen::launch_prefill<{V}, {T}, {D}, {KV}>(const attngen::PrefillProblemOf<{KV}>&, "
             "int, const {V}::Params&, cudaStream_t);",),
            ("template void attngen::launch_hopper_prefill<{V}, {T}, {D}, {KV}>(const "
             "attngen::PrefillProblemOf<{KV}>&, int, const {V}::Params&, cudaStream_t);",),
            ("template void attngen::launch_tile_map<{V}>(const attngen::TileMapProblem&, const {V}::Params&, "
             "cudaStream_t);", HOOK_PASS_INSTANCE)),
        (None, HOPPER_MACRO, None), shared_parts=(2,), unscaled_only=(HOOK_PASS_INSTANCE,)),
}


# the parts a plan reaches on an arch only when it asks for them (record, part): on sm_90a (whose shared
# memory is known: every tensor-core decode tile fits) the CUDA-core decode kernels serve only
# plan_decode(tensor_cores=False), and the mma.sync prefill kernels only plan_prefill(template="mma_sync")
# (csrc/prefill_dispatch.h prefers the Hopper template at every head dim it serves)
ALTERNATIVE_PARTS = {"sm_90a": (("decode", 0), ("prefill", 0))}


def deferred_part(cfg: BuildConfig, arch: str, record: str, part: int) -> bool:
    """Whether a link-time build links this part on first use (``BuildConfig.defer_alternatives``) rather
    than with the library: an alternative on ``arch`` the automatic choice never takes (every group size a
    build accepts fits the tensor-core decode tile's 8 rows; the mma.sync prefill where the Hopper part is
    built)."""
    if not cfg.defer_alternatives or (record, part) not in ALTERNATIVE_PARTS.get(arch, ()):
        return False
    return record == "decode" or HOPPER_MACRO in build_macros(cfg)


# the prefill record's part holding the tile-map classifier and the row-hook pass (LAUNCHERS["prefill"].parts)
CLASSIFIER_PART = ("prefill", 2)


def part_serves(variant, record: str, part: int) -> bool:
    """Whether a call of ``variant``'s library can reach part ``part`` of template ``record``. The classifier's
    part serves a mask beyond its bounds (plan_prefill derives maps for such masks alone and refuses
    tile_map=True for others) and a key or query transform (the row-hook pass; hook_pass=True is refused
    without one): a variant with neither has that part neither compiled nor linked."""
    if (record, part) != CLASSIFIER_PART:
        return True
    return mask_needs_map(variant) or any(row_hooks(variant))


def linked_exports(cfg: BuildConfig, head_dim: int, pair: DtypePair) -> list[LinkedExport]:
    return [e for record in selected(cfg.kernels) for e in LAUNCHERS[record.name].exports(cfg, head_dim, pair)]


def check_config(cfg: BuildConfig) -> None:
    """Refuse what link-time builds do not serve (yet): templates without a launcher record here."""
    missing = [k for k in cfg.kernels if k not in LAUNCHERS]
    if missing:
        raise ConfigError(f"link='lto' builds serve the templates {sorted(LAUNCHERS)}; {missing} need "
                          "link='whole'")
    if not nvjitlink.available():
        nvjitlink._module()  # raises the LinkError naming the missing packages


PARAM_BLOCK_BYTES = 256  # csrc/hook_abi.h kParamBlockBytes


def check_params_fit(variant, hs) -> None:
    """Refuse a variant whose parameters outgrow the block the linked kernels take."""
    size = params_bytes(variant, hs.dims or {})
    if size > PARAM_BLOCK_BYTES:
        raise ConfigError(f"variant '{variant.name}': its parameters take {size} bytes, more than the "
                          f"{PARAM_BLOCK_BYTES} a link-time build passes to the kernels; build with link='whole'")


def lto_gencode(arch: str) -> tuple[str, str]:
    """(nvcc -gencode for LTO-IR, nvJitLink's sm) of an arch name such as "sm_90a"."""
    sm = arch_spec(arch).name.removeprefix("sm_")
    return f"-gencode=arch=compute_{sm},code=lto_{sm}", sm


def _common_flags(cfg: BuildConfig, out: Path, csrc: Path = CSRC) -> tuple[str, ...]:
    return ("-std=c++17", "-O3", "-Xcompiler", "-fPIC", f"-I{csrc}", f"-I{out}", "--expt-relaxed-constexpr",
            *(("--use_fast_math",) if cfg.fast_math else ()))


def flag_text(cfg: BuildConfig) -> tuple[str, ...]:
    """:func:`_common_flags` with its directories as placeholders (for cache keys)."""
    return _common_flags(cfg, Path("<out>"), Path("<csrc>"))


def build_macros(cfg: BuildConfig) -> list[str]:
    """The companion templates' build macros of ``cfg`` (the Hopper prefill's where it has sm_90a)."""
    return companion_macros([arch_spec(a) for a in cfg.archs], cfg.kernels)


# ---- template objects ----

# A template object is device code alone: relocatable LTO-IR in a fatbinary, which nvJitLink links and nothing
# launches through a host stub (the library launches its cubins by the driver), so nvcc makes no host side
# (a third of the time of "-dc", which also runs cudafe++'s host output through the host compiler; the host
# compiler still preprocesses the device pass)
TEMPLATE_MODE = ("-rdc=true", "-fatbin")
TEMPLATE_FILE = "template.fatbin"

# Linked builds that defer alternatives give each Hopper kernel its one tiling (csrc/hopper_tile.cuh
# hopper_wide_choice): a variant's second tiling, taken for calls of long rows (kHopperWideRows), would add a
# kernel to the link of every edit. Whole-program builds, and linked ones with defer_alternatives=False, hold both.
ONE_TILING_DEFINE = "#define ATTNGEN_HOPPER_ONE_TILING 1"


def build_defines(cfg: BuildConfig, record: str | None = None, part: int = 0) -> str:
    """The lines part ``part`` of a template object of ``record`` (None: the launch object, which launches every
    record) opens with: the build's smem floor (arch.smem_floor_define) and, for the Hopper part of the prefill
    (the one its macro selects), ONE_TILING_DEFINE where the build has that template and defers alternatives
    ("" when neither applies; the other parts' objects stay shared between deferring builds and others)."""
    lines = [smem_floor_define(cfg.archs)]
    hopper_part = record is None or (record == "prefill" and LAUNCHERS[record].part_macros[part] == HOPPER_MACRO)
    if hopper_part and cfg.defer_alternatives and HOPPER_MACRO in build_macros(cfg):
        lines.append(ONE_TILING_DEFINE)
    return "\n".join(line for line in lines if line)


def template_source(record: str, head_dim: int, pair: DtypePair, max_group: int, part: int = 0,
                    defines: str = "") -> str:
    """One template object's source; ``defines``: the build's lines (:func:`build_defines`)."""
    launcher = LAUNCHERS[record]
    opening = [line for line in (launcher.parts[part], defines) if line]
    return "\n".join([*opening, f'#include "abi_d{head_dim}.cuh"', f'#include "{launcher.header}"',
                      '#include "tile_checks.h"', *launcher.instances(part, head_dim, pair, max_group)]) + "\n"


# traits flags only the prefill templates read (csrc/score_rules.cuh): a decode template object compiles with them
# false, so that signatures differing in them alone share it
PREFILL_ONLY_FLAGS = ("kLogitsAffine", "kLogitsAffineKv", "kLogitsPostBounded")
PREFILL_ONLY_COUNTS = {"kScoreSfuCalls": 0, "kLogitsPostScale": -1}  # (integer flags: these values outside prefill)


def record_abi(record: str, abi: str) -> str:
    """The ABI traits' text a template object of ``record`` compiles against: ``abi`` with the flags no kernel
    of the record reads (PREFILL_ONLY_FLAGS outside prefill) set false."""
    if record == "prefill":
        return abi
    for flag in PREFILL_ONLY_FLAGS:
        abi = abi.replace(flag_line(flag, "true"), flag_line(flag, "false"))
    for flag, neutral in PREFILL_ONLY_COUNTS.items():
        abi = re.sub(rf"(static constexpr int {flag} = )-?\d+;", rf"\g<1>{neutral};", abi)
    return abi


def template_key(record: str, arch: str, head_dim: int, pair: DtypePair, cfg: BuildConfig, abi: str,
                 part: int = 0) -> str:
    """The cache key of one template object: everything its LTO-IR depends on, and nothing of the
    variant beyond its hook signature (``abi``, the ABI traits' text, as the record reads it: record_abi)."""
    abi = record_abi(record, abi)
    return content_key({"lto_template": record, "file": TEMPLATE_FILE,
                        "source": template_source(record, head_dim, pair, cfg.max_group_size, part,
                                                  build_defines(cfg, record, part)),
                        "arch": arch, "head_dim": head_dim, "dtypes": [pair.q, pair.kv],
                        "max_group": cfg.max_group_size if record == "decode" else 0, "abi": abi,
                        "fast_math": cfg.fast_math, "csrc": csrc_hash(), "tiles": tiles_header(),
                        "enums": enums_header(), "attngen": attngen.__version__,
                        **nvcc_key((lto_gencode(arch)[0], *flag_text(cfg), *TEMPLATE_MODE))})


def template_object(record: str, arch: str, head_dim: int, pair: DtypePair, cfg: BuildConfig, abi: str,
                    cache: BuildCache, part: int = 0) -> tuple[Path, bool]:
    """The template object (of the record's part ``part``), built once per key; and whether the cache had it.
    Like the launch object and the exports, it leaves ``stats`` to the caller (:func:`count`): these compile
    in worker threads."""
    key = template_key(record, arch, head_dim, pair, cfg, abi, part)
    abi = record_abi(record, abi)
    gencode, _ = lto_gencode(arch)

    def build(out: Path) -> None:
        (out / f"abi_d{head_dim}.cuh").write_text(abi)
        (out / "attngen_enums.h").write_text(enums_header())
        (out / HEADER_NAME).write_text(tiles_header())
        src = out / "template.cu"
        src.write_text(template_source(record, head_dim, pair, cfg.max_group_size, part,
                                       build_defines(cfg, record, part)))
        obj = out / TEMPLATE_FILE
        nvcc.run_tool([nvcc.require_nvcc(), gencode, *_common_flags(cfg, out), *TEMPLATE_MODE, str(src), "-o",
                       str(obj)], f"nvcc of the {record} template (LTO-IR, {arch}, d{head_dim})")

    directory, hit = cache.get_or_build(key, build)
    return directory / TEMPLATE_FILE, hit


# ---- host glue: the launch object (per signature) and the exports (per parameter list) ----

def launch_source(cfg: BuildConfig, head_dim: int) -> str:
    """The launch object of one head dim: the records' entry templates over the block traits, one
    LinkedLaunch instance per export."""
    # the companion templates' macros (the Hopper prefill where the build has sm_90a): the dispatch routes to them
    defines = build_defines(cfg)
    parts = [f"#define {m} 1" for m in build_macros(cfg)] + ([defines] if defines else [])
    # host code alone: nvcc's device pass, which would instantiate nothing, skips parsing it (a fifth of the compile)
    parts += ["#ifndef __CUDA_ARCH__"]
    parts += [f'#include "abi_d{head_dim}.cuh"', '#include "linked_entry.h"', '#include "problem_glue.h"']
    scaled = any(pair.kv_scaled for pair in cfg.dtype_pairs)
    for record in selected(cfg.kernels):
        parts += [f'#include "{h}"' for h in record.headers]
        parts += [f'#include "{h}"' for h in SCALED_KV_HEADERS.get(record.name, ()) if scaled]
    parts.append('#include "tile_checks.h"')
    traits = f"attngen::BlockHooks<attngen_gen::Hooks_d{head_dim}>"
    for pair in cfg.dtype_pairs:
        for e in linked_exports(cfg, head_dim, pair):
            name_array = f"attngen_linked::kName_{e.name}"
            parts += [f"namespace attngen_linked {{ struct tag_{e.name}; "
                      f'static constexpr char kName_{e.name}[] = "{e.name}"; }}',
                      f"template <> struct attngen::LaunchEntryOf<{e.tag}> {{ using type = "
                      f"{e.entry.format(V=traits, N=name_array)}; }};",
                      f"template struct attngen::LinkedLaunch<{e.tag}, {e.own}>;"]
    parts.append("#endif  // __CUDA_ARCH__")
    return "\n".join(parts) + "\n"


def exports_source(variant, cfg: BuildConfig, params: dict[int, str]) -> str:
    """The exports of every head dim (``params``: head dim -> its LinkedParams source)."""
    parts = ['#include "linked_entry.h"', '#include "linked_register.h"']
    for d in cfg.head_dims:
        parts.append(params[d])
        for pair in cfg.dtype_pairs:
            for e in linked_exports(cfg, d, pair):
                name_array = f"kEntryName_{e.name}"
                parts += [f"namespace attngen_linked {{ struct tag_{e.name}; }}",
                          f"extern template struct attngen::LinkedLaunch<{e.tag}, {e.own}>;",
                          f'static constexpr char {name_array}[] = "{e.name}";',
                          f"ATTNGEN_EXPORT_TYPED_FUNC({e.name}, (attngen::LinkedEntry<{name_array}, "
                          f"attngen_gen::LinkedParams_d{d}, {e.tag}, {e.own}>::call));"]
    return "\n".join(parts) + "\n"


def _ffi_includes() -> list[str]:
    li = tvm_ffi.libinfo
    return [f"-I{li.find_include_path()}", f"-I{li.find_dlpack_include_path()}"]


# hidden: the launch object's template instances (same names in every library of the signature) and their static
# caches stay this library's; a default-visibility static of a template would be one object for the whole
# process (GNU unique), whichever library asked first
LAUNCH_FLAGS = ("-Xcompiler", "-fvisibility=hidden")


def launch_object(cfg: BuildConfig, head_dim: int, abi: str, cache: BuildCache) -> tuple[Path, bool]:
    """The launch object of one head dim (nvcc; no kernel is instantiated in it), keyed by its source and
    the hook signature: shared by every variant of that signature, whatever its parameters; and whether the
    cache had it."""
    src_text = launch_source(cfg, head_dim)
    gencode = lto_gencode(cfg.archs[0])[0].replace("code=lto_", "code=compute_")  # PTX of the first arch
    key = content_key({"lto_launch": src_text, "abi": abi, "csrc": csrc_hash(), "tiles": tiles_header(),
                       "enums": enums_header(), "tvm_ffi": tvm_ffi.__version__, "attngen": attngen.__version__,
                       **nvcc_key((gencode, *flag_text(cfg), *LAUNCH_FLAGS))})

    def build(out: Path) -> None:
        (out / f"abi_d{head_dim}.cuh").write_text(abi)
        (out / "attngen_enums.h").write_text(enums_header())
        (out / HEADER_NAME).write_text(tiles_header())
        src = out / "launch.cu"
        src.write_text(src_text)
        # its device pass sees no code (launch_source)
        nvcc.run_tool([nvcc.require_nvcc(), gencode, *_common_flags(cfg, out), *LAUNCH_FLAGS, *_ffi_includes(),
                       "-c", str(src), "-o", str(out / "launch.o")], f"nvcc of the launch object (d{head_dim})")

    directory, hit = cache.get_or_build(key, build)
    return directory / "launch.o", hit


def exports_object(variant, cfg: BuildConfig, params: dict[int, str], cache: BuildCache) -> tuple[Path, bool]:
    """The exports (the host C++ compiler alone, about a second), keyed by their source: the parameter
    lists, names, dtypes and layouts, never a hook body; and whether the cache had them."""
    src_text = exports_source(variant, cfg, params)
    cxx, cxx_version = host_cxx()
    key = content_key({"lto_exports": src_text, "csrc": csrc_hash(), "cxx": cxx_version,
                       "tvm_ffi": tvm_ffi.__version__, "attngen": attngen.__version__})

    def build(out: Path) -> None:
        src = out / "exports.cc"
        src.write_text(src_text)
        nvcc.run_tool([cxx, "-std=c++17", "-O2", "-fPIC", f"-I{CSRC}", *_ffi_includes(),
                       *(f"-I{d}" for d in nvcc.cuda_include_dirs()), "-c", str(src), "-o", str(out / "exports.o")],
                      "the exports' compile")

    directory, hit = cache.get_or_build(key, build)
    return directory / "exports.o", hit


# ---- the variant's part ----

def hook_unit(variant, cfg: BuildConfig, arch: str, lowered: dict) -> str:
    """The hook object's source for one arch: the lowered hooks (their headers, written by the
    instantiate stage) and the ABI functions of every head dim."""
    parts = ["// The variant's hooks behind the link-time ABI (csrc/hook_abi.h)."]
    for d in cfg.head_dims:
        parts.append(f'#include "hooks_{variant.name}_d{d}_{arch}.cuh"')
        parts.append(abi_hooks_source(variant, lowered[(arch, d)], d))
    return "\n".join(parts) + "\n"


def compile_hooks_source_check(source: str, arch: str = "sm_80") -> bytes:
    """LTO-IR of a source using the hook ABI, by NVRTC (tests: both sides of the ABI compile)."""
    _, sm = lto_gencode(arch)
    return nvrtc.compile_ltoir(source, "check.cu", sm, [CSRC, *nvcc.cuda_include_dirs()], False)


def compile_hooks(out: Path, cfg: BuildConfig, arch: str, source: str) -> Path:
    """The hook object (LTO-IR) of one arch: by NVRTC in-process where it is installed (about 0.03 s
    here), else by ``nvcc -dc`` (about 0.9 s, mostly the process's start)."""
    src = out / f"abi_hooks_{arch}.cu"
    src.write_text(source)
    gencode, sm = lto_gencode(arch)
    if nvrtc.available():
        obj = out / f"abi_hooks_{arch}.ltoir"
        include_dirs = [out, CSRC, *nvcc.cuda_include_dirs()]
        obj.write_bytes(nvrtc.compile_ltoir(source, src.name, sm, include_dirs, cfg.fast_math))
        return obj
    obj = out / f"abi_hooks_{arch}.o"
    nvcc.run_tool([nvcc.require_nvcc(), gencode, *_common_flags(cfg, out), "-dc", str(src), "-o", str(obj)],
                  f"nvcc of the hooks (LTO-IR, {arch})")
    return obj


def sm_number(sm: str) -> int:
    return int(re.match(r"\d+", sm).group())


def deferred_template(directory: Path, manifest: dict, entry: dict, cache: BuildCache) -> Path:
    """A deferred part's template object: from the library's own cache (its directory is
    <root>/<key[:2]>/<key>), the default or a shipped one, else compiled into ``cache`` now, from the hook
    signature the build kept beside the library, when this attngen and nvcc make the same object (same key)."""
    key = entry["template"]
    for root in (directory.parent.parent, cache.root, *cache.prebuilt):
        obj = root / key[:2] / key / TEMPLATE_FILE
        if obj.is_file() and entry_is_sealed(obj.parent):  # a damaged or half-written entry is not served
            return obj
    known = {f.name for f in fields(BuildConfig)}
    cfg = BuildConfig(**{k: v for k, v in manifest["config"].items() if k in known})
    d, pair = entry["head_dim"], DtypePair(*entry["dtypes"])
    abi = (directory / f"deferred_abi_d{d}.cuh").read_text()
    if template_key(entry["record"], entry["arch"], d, pair, cfg, abi, entry["record_part"]) != key:
        raise ConfigError(f"{directory}: the {entry['record']} template this library links on first use is in no "
                          f"build cache, and this machine cannot compile the same object (nvcc here: "
                          f"{nvcc.nvcc_version()}; or attngen's sources differ from the build's): rebuild the "
                          "variant here, or build it with defer_alternatives=False (--link-alternatives)")
    path, hit = template_object(entry["record"], entry["arch"], d, pair, cfg, abi, cache, entry["record_part"])
    count("template", hit)
    return path


def link_deferred(directory: Path, manifest: dict, device_sm: int, cache: BuildCache | None = None,
                  records: tuple[str, ...] | None = None) -> list[tuple[bytes, int, dict[str, str]]]:
    """The deferred parts of the linked library in ``directory`` (its ``manifest``) for a device of compute
    capability ``device_sm`` (major * 10 + minor), those of the template records ``records`` (None: all), as
    (cubin, arch number, key -> mangled name): each part's hook object (in the library's directory) linked with
    its template object (found by key in the library's cache, else ``cache`` or the shipped caches; compiled
    first where none has it, as a build defers its compile too) in one nvJitLink program, as the build links the
    others. Each linked cubin is an entry of ``cache`` of its own (the library's sealed entry stays as built),
    keyed by the library's entry, the part, the template object and the linker, and read from there later."""
    cache = cache or BuildCache()
    directory = Path(directory)
    fast_math = bool(manifest["config"].get("fast_math"))
    out = []
    for entry in manifest.get("deferred", []):
        arch = entry["arch"]
        sm = sm_number(lto_gencode(arch)[1])
        if sm // 10 != device_sm // 10 or sm > device_sm or (records is not None and entry["record"] not in records):
            continue
        key = content_key({"lto_deferred_cubin": directory.name, "part": entry["part"], "arch": arch,
                           "template": entry["template"], "fast_math": fast_math, "nvjitlink": nvjitlink.version()})

        def build(out_dir: Path, entry=entry, arch=arch) -> None:
            template = deferred_template(directory, manifest, entry, cache)
            (out_dir / "part.cubin").write_bytes(
                nvjitlink.link_cubin([directory / entry["hooks"], template], lto_gencode(arch)[1], fast_math))

        found, _ = cache.get_or_build(key, build)
        data = (found / "part.cubin").read_bytes()
        out.append((data, sm, kernel_table(cubin_kernels(data))))
    return out
