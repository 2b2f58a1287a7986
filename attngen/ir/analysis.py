"""Analysis passes over a validated Variant: what each hook reads, the mask class, scale folding.

The result, :class:`VariantAnalysis`, is what schedules and templates consult: a
hook that never reads ``kv_head`` need not be given one, a causal mask lets a
template skip tiles above the diagonal, and ``sm_scale`` (times log2 e when no
logits transform sits in between) is folded into the query once per row instead
of once per score.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm.tirx as tir

from . import tir_utils as tu
from .declarations import StateAlgebra
from .hook_spec import HEADS, HOOKS, ROW_ARGS, Site, hooks_at
from .mask_class import MaskInfo, classify_mask


@dataclass(frozen=True)
class HookReads:
    indices: tuple[str, ...]  # standard arguments the hook reads (e.g. qo_pos, kv_head)
    params: tuple[str, ...]  # extra parameters the hook reads


@dataclass(frozen=True)
class ScaleFold:
    """Where sm_scale and log2(e) are applied.

    q_scale_log2e: the query row is multiplied by sm_scale * log2(e) at load and scores
    are already in base 2 (softmax variants without a logits transform). Otherwise the
    query row is multiplied by sm_scale and the (transformed) score by log2(e) if the
    state is a softmax.
    """

    q_scale_log2e: bool
    logits_log2e: bool

    def describe(self) -> str:
        if self.q_scale_log2e:
            return "q *= sm_scale*log2(e) at load; scores are base-2 logits"
        return "q *= sm_scale at load" + ("; score *= log2(e) after the logits transform"
                                          if self.logits_log2e else "; scores used as weights")


@dataclass(frozen=True)
class VariantAnalysis:
    reads: dict[str, HookReads]
    mask: MaskInfo
    scale: ScaleFold

    @property
    def mask_reads_heads(self) -> bool:
        """Whether the mask hook reads a head index (its visibility may differ between a group's heads)."""
        reads = self.reads.get("logits_mask")
        return reads is not None and any(i in HEADS for i in reads.indices)

    def describe(self) -> str:
        lines = [f"mask: {self.mask.describe()}", f"scale: {self.scale.describe()}"]
        for hook, r in self.reads.items():
            lines.append(f"{hook}: reads indices {list(r.indices)} params {list(r.params)}")
        return "\n".join(lines)


def hook_reads(func: tir.PrimFunc, hook: str, extra_names: set[str]) -> HookReads:
    spec = HOOKS[hook]
    used_vars = tu.used_vars(func.body)
    used = {v.name for v in used_vars}
    names = tuple(n for n in spec.scalar_names if n in used)
    if spec.row and any(v.same_as(func.params[0]) for v in used_vars):
        names = (ROW_ARGS[0],) + names
    return HookReads(names, tuple(sorted(used & extra_names)))


def analyze_variant(v) -> VariantAnalysis:
    """The analyses of a validated Variant ``v``."""
    extra = {p.name for p in v.params}
    reads = {h: hook_reads(f, h, extra) for h, f in v.hooks.items()}
    int_scalars = {p.name for p in v.scalar_params if "int" in p.dtype}
    (mask_kind,) = hooks_at(Site.VISIBILITY)  # one kind decides which keys exist; its class lets templates skip tiles
    mask = classify_mask(v.hooks.get(mask_kind), int_scalars)
    softmax = v.state == StateAlgebra.SOFTMAX
    # A hook that changes scores sits between the scaled dot product and the exponent, so log2(e)
    # cannot ride on the query scale there.
    rewrites_scores = any(HOOKS[h].site is Site.SCORE for h in v.hooks)
    scale = ScaleFold(q_scale_log2e=softmax and not rewrites_scores, logits_log2e=softmax and rewrites_scores)
    return VariantAnalysis(reads, mask, scale)
