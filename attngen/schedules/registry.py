"""The template registry: every CUDA template record by name, and what a build reads from it (which
templates a ``kernels`` selection instantiates, whether an arch can run them and hold their tiles)."""
from __future__ import annotations

from .arch import ArchSpec
from .dtypes import DtypePair
from .template_decode import DECODE
from .template_decode_tc import DECODE_TC
from .template_prefill import PREFILL
from .template_prefill_hopper import PREFILL_HOPPER
from .template_tvm import TVM_SLOTS
from .templates import FitQuery, TemplateRecord

TEMPLATES: dict[str, TemplateRecord] = {r.name: r for r in (DECODE_TC, DECODE, PREFILL, PREFILL_HOPPER, TVM_SLOTS)}
# BuildConfig.kernels values: the templates with exported functions of their own
KERNELS: tuple[str, ...] = tuple(name for name, r in TEMPLATES.items() if r.selectable)


def template(name: str) -> TemplateRecord:
    if name not in TEMPLATES:
        raise KeyError(f"no template {name!r}; known: {sorted(TEMPLATES)}")
    return TEMPLATES[name]


def selected(kernels: tuple[str, ...]) -> list[TemplateRecord]:
    """The templates a ``kernels`` selection exports functions from, in registry order."""
    for k in kernels:
        template(k)
    return [r for n, r in TEMPLATES.items() if n in kernels]


def instantiated(kernels: tuple[str, ...]) -> list[TemplateRecord]:
    """The selected templates and every template they require, in registry order."""
    names: set[str] = set()
    todo = list(kernels)
    while todo:
        name = todo.pop()
        if name not in names:
            names.add(name)
            todo += template(name).requires
    return [r for n, r in TEMPLATES.items() if n in names]


def companions(arch: ArchSpec, kernels: tuple[str, ...]) -> list[TemplateRecord]:
    """The companion templates of the selection that ``arch`` has what they need for."""
    names = {c for r in instantiated(kernels) for c in r.companions}
    return [r for n, r in TEMPLATES.items() if n in names and r.arch_problem(arch) is None]


def companion_macros(archs: list[ArchSpec], kernels: tuple[str, ...]) -> list[str]:
    """The build macros of every companion some arch of a build compiles in."""
    return sorted({r.build_macro for a in archs for r in companions(a, kernels)})


def every_arch_macros(archs: list[ArchSpec], kernels: tuple[str, ...]) -> list[str]:
    """The every-arch macros (TemplateRecord.every_arch_macro) of the companions every arch of a build
    compiles in."""
    per_arch = [companions(a, kernels) for a in archs]
    return sorted(r.every_arch_macro for r in (per_arch[0] if per_arch else ()) if all(r in c for c in per_arch))


def head_dims_of(kernels: tuple[str, ...]) -> tuple[int, ...]:
    """Head dims every template of the selection supports."""
    records = instantiated(kernels) or list(TEMPLATES.values())
    return tuple(d for d in records[0].head_dims if all(d in r.head_dims for r in records))


def arch_problems(arch: ArchSpec, kernels: tuple[str, ...]) -> list[str]:
    """Why ``arch`` cannot run the selection's templates (their arch predicates); empty when it can."""
    return [p for r in instantiated(kernels) if (p := r.arch_problem(arch)) is not None]


def fit_problems(arch: ArchSpec, kernels: tuple[str, ...], head_dims: tuple[int, ...], pairs: tuple[DtypePair, ...],
                 max_group: int, key_transform: bool) -> list[str]:
    """A message for every configuration the selection needs that ``arch``'s shared memory cannot hold."""
    problems = []
    for d in head_dims:
        query = FitQuery(d, max_group, key_transform)
        for r in instantiated(kernels) + companions(arch, kernels):
            for cfg in r.must_fit(query):
                need = max(r.smem_bytes(cfg, p.element_bytes) for p in pairs)
                if need > arch.smem_per_block:
                    problems.append(f"{r.name} head_dim {d}{cfg.describe()} needs {need} B of shared memory, "
                                    f"{arch.name} has {arch.smem_per_block} B")
    return problems
