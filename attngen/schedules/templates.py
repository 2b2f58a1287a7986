"""TemplateRecord: everything attngen knows about one CUDA kernel role, in one place.

A record is data that the build, the generated C++ header and the runtime planner all read:

- ``needs``: what the template needs from an arch (checked against ``ArchSpec`` fields);
- ``head_dims`` and ``configs``: its commented tile table (the module that defines the record explains
  each choice); ``smem_bytes``: the shared memory of one configuration, for given element sizes;
- ``must_fit``: the configurations an arch's shared memory has to hold for a build to be accepted (the
  launcher's last resort; a template that falls back to another one has none);
- ``header_section``: the record's part of the generated ``attngen_tiles.h`` that the C++ templates
  ``static_assert`` against (csrc/tile_checks.h);
- ``headers``, ``exports``, ``emitter``, ``variant_check``: the entry headers its translation unit
  includes, the exported function kinds (``{layout}`` stands for each paged layout, lower case), and the
  keys under which the CUDA backend finds its C++ emitter and its build-time variant check (schedules
  never import the code generators);
- ``requires``: templates an entry of this one launches (instantiated and checked with it);
- ``companions``: templates its entries launch instead on archs that have what those need (the Hopper
  prefill for ``prefill``): fitted only on those archs, compiled in with ``ATTNGEN_WITH_<NAME>`` defined
  where a build has such an arch, and chosen at run time by the device.

A record with exports is one value of ``BuildConfig.kernels`` and one translation unit per
(head_dim, dtype pair); a record without (decode_tc) is reached only through ``requires``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .arch import ArchSpec
from .dtypes import ElementBytes


@dataclass(frozen=True)
class ArchNeeds:
    """What a template needs from an arch; every field names the ArchSpec field it is checked against."""

    mma: tuple[str, ...] = ()  # any one of these tensor-core shapes (ArchSpec.mma); () = none needed
    cp_async: bool = False  # ArchSpec.has_cp_async (templates that also run without it leave this False)
    wgmma: bool = False  # ArchSpec.has_wgmma
    tma: bool = False  # ArchSpec.has_tma

    def missing(self, arch: ArchSpec) -> list[str]:
        """What ``arch`` lacks of these needs, in words; empty when it has them all."""
        out = []
        if self.mma and not set(self.mma) & set(arch.mma):
            out.append(f"tensor-core shapes {list(self.mma)} (it has {list(arch.mma)})")
        if self.cp_async and not arch.has_cp_async:
            out.append("cp.async")
        if self.wgmma and not arch.has_wgmma:
            out.append("wgmma")
        if self.tma and not arch.has_tma:
            out.append("TMA")
        return out


@dataclass(frozen=True)
class FitQuery:
    """What decides which tile configurations of a build must fit an arch's shared memory."""

    head_dim: int
    max_group: int  # BuildConfig.max_group_size
    key_transform: bool  # the variant transforms keys (the CUDA-core decode keeps fp32 key rows)


@dataclass(frozen=True)
class TemplateRecord:
    name: str
    role: str  # one line: what the template computes and how
    needs: ArchNeeds
    head_dims: tuple[int, ...]
    configs: Callable[[int], tuple]  # head_dim -> every tile configuration (launcher order)
    smem_bytes: Callable[[object, ElementBytes], int]  # (configuration, element sizes) -> bytes
    must_fit: Callable[[FitQuery], tuple]  # configurations a build needs to fit the arch's shared memory
    header_section: Callable[[tuple[int, ...]], str]  # element sizes -> C++ tables for attngen_tiles.h
    headers: tuple[str, ...] = ()  # csrc headers its translation unit includes
    exports: tuple[str, ...] = ()  # exported function kinds, e.g. "batch_decode_paged_{layout}"
    emitter: str | None = None  # key of the C++ emitter of its exported functions (CUDA backend)
    variant_check: str | None = None  # key of a build-time check of the variant (CUDA backend)
    requires: tuple[str, ...] = ()  # templates its entries launch
    companions: tuple[str, ...] = ()  # templates its entries launch on archs that have their needs

    @property
    def build_macro(self) -> str:
        """Defined in a build that compiles this template in as a companion."""
        return "ATTNGEN_WITH_" + self.name.upper()

    @property
    def every_arch_macro(self) -> str:
        """Defined in a build whose every arch compiles this template in as a companion (its launchers may
        then take it without a run-time fallback: csrc/prefill_dispatch.h launch_prefill_auto)."""
        return "ATTNGEN_EVERY_ARCH_WITH_" + self.name.upper()

    @property
    def selectable(self) -> bool:
        """Whether a build names it in ``BuildConfig.kernels`` (it exports functions of its own)."""
        return bool(self.exports)

    def arch_problem(self, arch: ArchSpec) -> str | None:
        missing = self.needs.missing(arch)
        return f"the {self.name} template needs {', '.join(missing)}, which {arch.name} lacks" if missing else None

    def kinds(self, layouts: tuple[str, ...]) -> list[str]:
        """Exported function kinds with each paged layout filled in (before the dtype and head_dim)."""
        out = []
        for pattern in self.exports:
            if "{layout}" in pattern:
                out += [pattern.format(layout=layout.lower()) for layout in layouts]
            else:
                out.append(pattern)
        return out
