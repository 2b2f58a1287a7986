"""The hook contract: which hooks exist, the exact leading signature of each, and what every
consumer needs to know about one (where it is applied, what stands in when it is absent).

A hook is a TVMScript ``@T.prim_func``. Its leading parameters are the standard
ones listed here (same names, same order, same dtypes); any parameters after them
must be extra parameters declared on the Variant.

Row hooks (query/key/output transform) take two float32 buffers of ``head_dim``
elements, the input row and the output row, and store only into the output row.
Scalar hooks (logits transform, logits mask) return one value and store nothing.

``HOOKS`` is the one list of hook kinds: the Variant's keywords, the checks, the analyses,
the CPU inliner, the CUDA lowering and the reference interpreter all iterate over it or
look a hook up in it. A new kind is a new row here plus the template code that calls it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Site(str, enum.Enum):
    """Where templates apply a hook. Hooks of one site see the same standard arguments."""

    QUERY_LOAD = "query_load"  # once per query row, when Q is loaded
    KEY_LOAD = "key_load"  # once per key row, when K is loaded
    SCORE = "score"  # per (query, key) score, before masking: changes the score
    VISIBILITY = "visibility"  # per (query, key): whether the key exists for the query at all
    EPILOGUE = "epilogue"  # once per output row, after the softmax


ROW_ARGS = ("in_row", "out_row")  # the two leading buffer parameters of a row hook


@dataclass(frozen=True)
class HookSpec:
    name: str
    site: Site
    row: bool  # takes (in_row[d], out_row[d], ...) buffers
    scalars: tuple[tuple[str, str], ...]  # standard scalar params after the rows: (name, dtype)
    returns: str | None  # dtype returned by a scalar hook
    # What stands in for an absent hook: a row hook passes ``in_row`` through; a scalar hook returns
    # the standard argument named here unchanged, or the constant given (True: every key is visible).
    identity: str | bool
    cpp_name: str  # its forwarding functions in the C++ traits struct: <cpp_name> (scalar hooks),
    #                <cpp_name>_row / <cpp_name>_elem (row hooks: whole row / one element)
    applied: str  # where templates call it, in words (docs and `attngen inspect`)

    @property
    def scalar_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.scalars)

    @property
    def n_standard(self) -> int:
        """How many leading parameters are standard (the rest are the variant's extra parameters)."""
        return (len(ROW_ARGS) if self.row else 0) + len(self.scalars)

    def signature(self) -> str:
        parts = [f"{r}: T.Buffer((d,), 'float32')" for r in ROW_ARGS] if self.row else []
        parts += [f"{n}: T.{t}" for n, t in self.scalars]
        ret = f" -> T.{self.returns}" if self.returns else ""
        return f"def {self.name}({', '.join(parts)}, <extra params>){ret}"


_I32 = "int32"
_SCORE_INDICES = (("batch", _I32), ("qo_pos", _I32), ("kv_pos", _I32), ("qo_head", _I32), ("kv_head", _I32))
HOOKS: dict[str, HookSpec] = {
    h.name: h
    for h in (
        HookSpec("query_transform", Site.QUERY_LOAD, True, (("qo_pos", _I32), ("qo_head", _I32)), None,
                 "in_row", "query", "once per query row, when Q is loaded"),
        HookSpec("key_transform", Site.KEY_LOAD, True, (("kv_pos", _I32), ("kv_head", _I32)), None,
                 "in_row", "key", "once per key row, when a K tile is loaded"),
        HookSpec("logits_transform", Site.SCORE, False, (("s", "float32"),) + _SCORE_INDICES, "float32",
                 "s", "logits", "per score, before masking"),
        HookSpec("logits_mask", Site.VISIBILITY, False, _SCORE_INDICES, "bool",
                 True, "mask", "per score; False removes the key for that query"),
        HookSpec("output_transform", Site.EPILOGUE, True,
                 (("batch", _I32), ("qo_pos", _I32), ("qo_head", _I32), ("lse", "float32")), None,
                 "in_row", "output", "once per output row in the epilogue; lse is the row's base-2 log-sum-exp"),
    )
}
HOOK_ORDER = tuple(HOOKS)

# Standard scalar arguments by what they index. Views that renumber one of these (cascade levels and
# block-sparse rows restart positions, headwise block-sparse calls restart heads) refuse hooks reading it.
POSITIONS = ("qo_pos", "kv_pos")
HEADS = ("qo_head", "kv_head")
SOFTMAX_ONLY = ("lse",)  # standard arguments a sum-state variant cannot supply
STANDARD_SCALARS = frozenset(n for h in HOOKS.values() for n in h.scalar_names)


def hooks_at(site: Site) -> tuple[str, ...]:
    """The hook kinds a template applies at ``site``, in ``HOOK_ORDER``."""
    return tuple(name for name, spec in HOOKS.items() if spec.site is site)


def row_hooks(variant) -> tuple[bool, bool]:
    """Whether the variant has a key transform and a query transform."""
    return "key_transform" in variant.hooks, "query_transform" in variant.hooks
