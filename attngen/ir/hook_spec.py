"""The hook contract: which hooks exist and the exact leading signature of each.

A hook is a TVMScript ``@T.prim_func``. Its leading parameters are the standard
ones listed here (same names, same order, same dtypes); any parameters after them
must be extra parameters declared on the Variant.

Row hooks (query/key/output transform) take two float32 buffers of ``head_dim``
elements, the input row and the output row, and store only into the output row.
Scalar hooks (logits transform, logits mask) return one value and store nothing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HookSpec:
    name: str
    row: bool  # takes (in_row[d], out_row[d], ...) buffers
    scalars: tuple[tuple[str, str], ...]  # standard scalar params after the rows: (name, dtype)
    returns: str | None  # dtype returned by a scalar hook
    applied: str  # where templates call it (for docs and `attngen inspect`)

    def signature(self) -> str:
        parts = ["in_row: T.Buffer((d,), 'float32')", "out_row: T.Buffer((d,), 'float32')"] if self.row else []
        parts += [f"{n}: T.{t}" for n, t in self.scalars]
        ret = f" -> T.{self.returns}" if self.returns else ""
        return f"def {self.name}({', '.join(parts)}, <extra params>){ret}"


_I32 = "int32"
HOOKS: dict[str, HookSpec] = {
    h.name: h
    for h in (
        HookSpec("query_transform", True, (("qo_pos", _I32), ("qo_head", _I32)), None,
                 "once per query row, when Q is loaded"),
        HookSpec("key_transform", True, (("kv_pos", _I32), ("kv_head", _I32)), None,
                 "once per key row, when a K tile is loaded"),
        HookSpec("logits_transform", False,
                 (("s", "float32"), ("batch", _I32), ("qo_pos", _I32), ("kv_pos", _I32),
                  ("qo_head", _I32), ("kv_head", _I32)), "float32",
                 "per score, before masking"),
        HookSpec("logits_mask", False,
                 (("batch", _I32), ("qo_pos", _I32), ("kv_pos", _I32), ("qo_head", _I32),
                  ("kv_head", _I32)), "bool",
                 "per score; False removes the key for that query"),
        HookSpec("output_transform", True,
                 (("batch", _I32), ("qo_pos", _I32), ("qo_head", _I32), ("lse", "float32")), None,
                 "once per output row in the epilogue; lse is the row's base-2 log-sum-exp"),
    )
}
HOOK_ORDER = tuple(HOOKS)
