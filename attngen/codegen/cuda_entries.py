"""The exported entry functions of attngen's own calling convention (decode, prefill / append): one
explicit export per (head_dim, dtype pair, layout) of the C++ entry templates in csrc/entry_decode.h,
csrc/entry_prefill.h (the decode and prefill records' headers, included by the translation unit) and, over an
fp8 cache with k_scale / v_scale, csrc/entry_decode_fp8.h and csrc/entry_prefill_fp8.h, which hold the
calling convention, the argument checks and the launch.

Each export names its function once more as a ``constexpr char`` array beside it, the entry's
``Name`` template argument, so that every error the entry raises names the exported function. The entry
template-ids (:func:`decode_entry`, :func:`prefill_entry`) are shared with link-time builds (:mod:`.lto`),
which instantiate them over other traits and name arrays.
"""
from __future__ import annotations

from attngen.schedules.build_config import symbol
from attngen.schedules.dtypes import DtypePair

from .cuda_variant import C_TYPES

LAYOUT_ENUMS = {"NHD": "attngen::KVLayout::kNHD", "HND": "attngen::KVLayout::kHND"}
# cuda_fp8.h's element types of the fp8 K/V formats (csrc/fp8_kv.cuh)
FP8_C_TYPES = {"float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}
# the entry headers a record's code adds for an fp8 cache (dequantising loads, k_scale / v_scale)
SCALED_KV_HEADERS = {"decode": ("entry_decode_fp8.h",), "prefill": ("entry_prefill_fp8.h",)}


def kv_c_type(pair: DtypePair) -> str:
    """The C++ element type of the pair's K/V: the query's, or an fp8 cache's cuda_fp8.h type."""
    return FP8_C_TYPES[pair.kv] if pair.kv_scaled else C_TYPES[pair.kv]


def _export(name: str, entry: str) -> str:
    """The name array and the TVM-FFI export of one instantiated entry (``entry``: its template-id, with
    ``{name}`` standing for the name array)."""
    name_array = f"kEntryName_{name}"
    return f"""static constexpr char {name_array}[] = "{name}";
ATTNGEN_EXPORT_TYPED_FUNC({name}, ({entry.format(name=name_array)}::call));
"""


def decode_entry(hooks: str, head_dim: int, pair: DtypePair, layout: str, max_group: int, name: str) -> str:
    """The decode entry's template-id over the traits ``hooks`` and the name array ``name``: DecodePagedEntry,
    or for an fp8 cache (``pair.kv_scaled``) DecodePagedFP8Entry, which takes k_scale / v_scale."""
    tail = f"{head_dim}, {LAYOUT_ENUMS[layout]}, {max_group}, {name}"
    if pair.kv_scaled:
        return f"attngen::DecodePagedFP8Entry<{hooks}, {C_TYPES[pair.q]}, {kv_c_type(pair)}, {tail}>"
    return f"attngen::DecodePagedEntry<{hooks}, {C_TYPES[pair.q]}, {tail}>"


def prefill_entry(hooks: str, head_dim: int, pair: DtypePair, layout: str | None, name: str) -> str:
    """The prefill entry's template-id (``layout`` None: the ragged one) over the traits ``hooks`` and the name
    array ``name``; for an fp8 cache the ``...FP8Entry`` taking k_scale / v_scale."""
    scaled = "FP8" if pair.kv_scaled else ""
    types = f"{C_TYPES[pair.q]}, {kv_c_type(pair)}" if pair.kv_scaled else C_TYPES[pair.q]
    layout_arg = "" if layout is None else f"{LAYOUT_ENUMS[layout]}, "
    return (f"attngen::Prefill{'Ragged' if layout is None else 'Paged'}{scaled}Entry<{hooks}, {types}, {head_dim}, "
            f"{layout_arg}{name}>")


def prefill_kind(layout: str | None) -> str:
    """The prefill export's kind: ragged (``layout`` None) or paged in ``layout``."""
    return "batch_prefill_ragged" if layout is None else f"batch_prefill_paged_{layout.lower()}"


def decode_wrapper(head_dim: int, pair: DtypePair, layout: str, max_group: int) -> str:
    """``batch_decode_paged_<layout>_<dtype>_d<D>`` over the variant traits ``Hooks_d<D>``; for an fp8 cache
    (``pair.kv_scaled``) ``batch_decode_paged_<layout>_<dtype>_kv<fp8>_d<D>``, which takes k_scale / v_scale."""
    name = symbol(f"batch_decode_paged_{layout.lower()}", pair.q, head_dim, pair.kv)
    return _export(name, decode_entry(f"attngen_gen::Hooks_d{head_dim}", head_dim, pair, layout, max_group, "{name}"))


def prefill_wrapper(head_dim: int, pair: DtypePair, layout: str | None) -> str:
    """``batch_prefill_ragged_<dtype>_d<D>`` (``layout`` None) or ``batch_prefill_paged_<layout>_...``; for an fp8
    cache (``pair.kv_scaled``) ``..._<dtype>_kv<fp8>_d<D>``, which takes k_scale / v_scale."""
    name = symbol(prefill_kind(layout), pair.q, head_dim, pair.kv)
    return _export(name, prefill_entry(f"attngen_gen::Hooks_d{head_dim}", head_dim, pair, layout, "{name}"))


def tile_map_wrapper(head_dim: int, pair: DtypePair) -> str:
    """``prefill_tile_map_<dtype>_d<D>`` (``..._kv<fp8>_d<D>`` beside an fp8 cache's prefill functions): the
    plan's classifier of a launch's tiles (csrc/tile_map.cuh), which reads no K/V."""
    name = symbol("prefill_tile_map", pair.q, head_dim, pair.kv)
    return _export(name, f"attngen::TileMapEntry<attngen_gen::Hooks_d{head_dim}, {head_dim}, {{name}}>")
