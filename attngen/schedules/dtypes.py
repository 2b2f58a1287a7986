"""Element types of a build: the (query/output, KV) dtype pair a kernel is instantiated for, the short
names exported symbols carry, and the bytes per element that shared-memory budgets are computed from.

fp8 K/V (``FP8_DTYPES``, torch's names ``float8_e4m3fn`` / ``float8_e5m2``) are storage formats of a
KV cache only: a query, an output or any arithmetic never takes them. Their values are the stored
value times a scale (``k_scale`` / ``v_scale``, see ``attngen.runtime.fp8``).
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3",
               "float8_e5m2": "e5m2"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")  # K/V storage formats that need scales
FP8_BYTES = DTYPE_BYTES[FP8_DTYPES[0]]  # bytes of an fp8 K/V element (every format of FP8_DTYPES)


def is_fp8(dtype: str) -> bool:
    return dtype in FP8_DTYPES


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
    def kv_scaled(self) -> bool:
        """K/V are stored quantised (fp8): their kernels take ``k_scale`` / ``v_scale``."""
        return is_fp8(self.kv)

    @property
    def short(self) -> str:
        """The pair's part of a symbol or file name: ``bf16`` when K/V share the query's dtype, else
        ``<q>_kv<kv>`` (e.g. ``bf16_kvf16``, ``f16_kve4m3``)."""
        if self.kv == self.q:
            return DTYPE_SHORT[self.q]
        return f"{DTYPE_SHORT[self.q]}_kv{DTYPE_SHORT[self.kv]}"
