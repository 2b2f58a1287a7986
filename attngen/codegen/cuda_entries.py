"""The exported entry functions of attngen's own calling convention (decode, prefill / append): the C++
source that turns TVM-FFI arguments into a template launch for one (head_dim, dtype, layout).

Decode calling convention (all tensors on one CUDA device, the current stream is used):
``(q[B,Hq,D], pages, indices[nnz], indptr[B+1], last_page_len[B], o[B,Hq,D], lse[B,Hq],
part_o[B,C,Hq,D] f32, part_lse[B,C,Hq] f32, sm_scale, num_chunks, backend, plan, plan_ctas, plan_merges,
<extra params...>)``; with ``plan_ctas`` > 0, ``plan`` is the device copy of a split-KV plan
(runtime/decode_plan.py), the grid is (plan_ctas, Hkv), part_o / part_lse are [slots, Hq, (D)] and
``num_chunks`` is ignored;
``backend`` 0 lets the launcher choose, 1 forces the CUDA-core template, 2 the tensor-core one (which
falls back to CUDA cores where the device's shared memory cannot hold its smallest tile).
"""
from __future__ import annotations

from attngen.ir import TensorParam
from attngen.schedules.build_config import symbol

from .cuda_variant import C_TYPES


def _extra_args(variant) -> tuple[str, str]:
    """(C++ parameter list, Params-filling statements) for the variant's extra parameters."""
    decl, fill = [], []
    for p in variant.params:
        if isinstance(p, TensorParam):
            decl.append(f"tvm::ffi::TensorView {p.name}")
            fill.append(f"  hp.{p.name} = static_cast<{C_TYPES[p.dtype]}*>(attngen::data_of({p.name}));")
        elif "int" in p.dtype:
            decl.append(f"int64_t {p.name}")
            fill.append(f"  hp.{p.name} = static_cast<{C_TYPES[p.dtype]}>({p.name});")
        else:
            decl.append(f"double {p.name}")
            fill.append(f"  hp.{p.name} = static_cast<float>({p.name});")
    return "".join(", " + d for d in decl), "\n".join(fill)


def decode_wrapper(variant, head_dim: int, dtype: str, layout: str, max_group: int) -> str:
    name = symbol(f"batch_decode_paged_{layout.lower()}", dtype, head_dim)
    decl, fill = _extra_args(variant)
    hnd = "true" if layout == "HND" else "false"
    return f"""
static void {name}(tvm::ffi::TensorView q, tvm::ffi::TensorView pages, tvm::ffi::TensorView indices,
    tvm::ffi::TensorView indptr, tvm::ffi::TensorView last_page_len, tvm::ffi::TensorView o,
    tvm::ffi::TensorView lse, tvm::ffi::TensorView part_o, tvm::ffi::TensorView part_lse, double sm_scale,
    int64_t num_chunks, int64_t backend, tvm::ffi::TensorView plan, int64_t plan_ctas,
    int64_t plan_merges{decl}) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {C_TYPES[dtype]};
  V::Params hp{{}};
{fill}
  attngen::DecodeProblem P{{}};
  attngen::fill_decode(P, q, o, lse, sm_scale,
                       attngen::kv_from_pages(P.kv, pages, {hnd}, indptr, indices, last_page_len), "{name}");
  P.part_o = static_cast<float*>(attngen::data_of(part_o));
  P.part_lse = static_cast<float*>(attngen::data_of(part_lse));
  P.num_chunks = static_cast<int>(num_chunks);
  P.backend = static_cast<int>(backend);
  P.plan = plan_ctas > 0 ? static_cast<const int32_t*>(attngen::data_of(plan)) : nullptr;
  P.plan_ctas = static_cast<int>(plan_ctas);
  P.plan_max_merges = static_cast<int>(plan_merges);
  if (P.group > {max_group})
    TVM_FFI_THROW(ValueError) << "{name}: group size " << P.num_qo_heads << "/" << P.num_kv_heads
        << " is not served; this library was built with max_group_size={max_group}";
  if (P.batch == 0) return;
  if (P.num_chunks < 1) TVM_FFI_THROW(ValueError) << "{name}: num_chunks must be at least 1";
  if (P.backend < 0 || P.backend > 2)
    TVM_FFI_THROW(ValueError) << "{name}: backend must be 0 (automatic), 1 (CUDA cores) or 2 (tensor cores)";
  if (!P.plan && P.num_chunks > 1 && (part_o.numel() < int64_t(P.batch) * P.num_chunks * P.num_qo_heads * {head_dim} ||
                           part_lse.numel() < int64_t(P.batch) * P.num_chunks * P.num_qo_heads))
    TVM_FFI_THROW(ValueError) << "{name}: part_o / part_lse are smaller than batch x num_chunks x heads";
  if (!attngen::launch_decode<V, T, {head_dim}, {max_group}>(P, hp, attngen::stream_of(q)))
    TVM_FFI_THROW(ValueError) << "{name}: no tensor-core decode tile fits this device's shared memory, and a "
                                 "split-KV plan needs one; plan with tensor_cores=False";
  attngen::check_launch("{name}");
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
"""


def prefill_wrapper(variant, head_dim: int, dtype: str, layout: str | None) -> str:
    """``layout`` None: ragged K/V; else paged with that layout."""
    kind = "batch_prefill_ragged" if layout is None else f"batch_prefill_paged_{layout.lower()}"
    name = symbol(kind, dtype, head_dim)
    decl, fill = _extra_args(variant)
    if layout is None:
        kv_args = "tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView kv_indptr"
        kv_heads = "attngen::kv_from_ragged<T>(P.kv, k, v, kv_indptr)"
    else:
        kv_args = ("tvm::ffi::TensorView pages, tvm::ffi::TensorView indices, tvm::ffi::TensorView indptr, "
                   "tvm::ffi::TensorView last_page_len")
        hnd = "true" if layout == "HND" else "false"
        kv_heads = f"attngen::kv_from_pages(P.kv, pages, {hnd}, indptr, indices, last_page_len)"
    return f"""
static void {name}(tvm::ffi::TensorView q, {kv_args}, tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView o,
    tvm::ffi::TensorView lse, double sm_scale, int64_t max_qo_len, int64_t tile_rows{decl}) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {C_TYPES[dtype]};
  V::Params hp{{}};
{fill}
  attngen::PrefillProblem P{{}};
  attngen::fill_prefill(P, q, qo_indptr, o, lse, sm_scale, {kv_heads}, "{name}");
  P.tile_rows = static_cast<int>(tile_rows);
  if (P.tile_rows != 0 && P.tile_rows != 64 && P.tile_rows != 128)
    TVM_FFI_THROW(ValueError) << "{name}: tile_rows must be 0 (the library's choice), 64 or 128";
  attngen::launch_prefill<V, T, {head_dim}>(P, static_cast<int>(max_qo_len), hp, attngen::stream_of(q));
  attngen::check_launch("{name}");
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
"""
