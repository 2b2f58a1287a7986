"""Element types of a build: the (query/output, KV) dtype pair a kernel is instantiated for, the short
names exported symbols carry, and the bytes per element that shared-memory budgets are computed from."""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ElementBytes:
    """Bytes per element of the rows a tile configuration holds in shared memory."""

    q: int  # query (and output) rows
    kv: int  # key and value rows


@dataclass(frozen=True)
class DtypePair:
    """The dtype of the query and output, and the dtype of the paged / ragged keys and values."""

    q: str
    kv: str

    @property
    def element_bytes(self) -> ElementBytes:
        return ElementBytes(DTYPE_BYTES[self.q], DTYPE_BYTES[self.kv])

    @property
    def short(self) -> str:
        """The pair's part of a symbol or file name: ``bf16`` when K/V share the query's dtype, else
        ``<q>_kv<kv>`` (e.g. ``bf16_kvf16``)."""
        if self.kv == self.q:
            return DTYPE_SHORT[self.q]
        return f"{DTYPE_SHORT[self.q]}_kv{DTYPE_SHORT[self.kv]}"
