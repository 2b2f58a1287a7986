"""Plugging attngen functions into TVM's PagedKVCache (``vm.builtin.paged_attention_kv_cache_create``).

So far: the merge slot. TVM calls it as ``f(o, lse, o_other, lse_other)`` with o [n, H, D] and
lse [n, H] float32 in base 2, merging in place; attngen's CPU merge has exactly that calling
convention and also accepts TVM's -5e4 "no key" lse as well as -inf.
"""
from __future__ import annotations

CPU_MERGE_DTYPES = ("float32", "float16")


def merge_slot_function(dtype: str = "float32"):
    """The function to pass in the create call's merge tuple, e.g. ``[merge_slot_function("float32")]``."""
    from attngen.schedules.build_config import DTYPE_SHORT

    from .state import _cpu_library

    if dtype not in CPU_MERGE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the CPU merge slot serves {list(CPU_MERGE_DTYPES)}")
    return _cpu_library()[f"merge_state_inplace_{DTYPE_SHORT[dtype]}"]
