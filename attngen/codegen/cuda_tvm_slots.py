"""CUDA functions with TVM PagedKVCache's attention-slot calling conventions.

Two conventions, both exported by a ``kernels=("tvm",)`` library: ("tirx", fn) (below) and
("flashinfer", run, plan) (``flashinfer_slot_wrappers``: TVM plans once per step with host
index arrays; attngen's decode plan is its load-balanced split-KV work list, packed into TVM's
page-locked buffer and copied to its int workspace; prefill's plan records the longest
request so the grid fits the batch).

The CUDA library built with ``kernels=("tvm", ...)`` exports, per (head_dim, dtype),
``tvm_prefill_paged_<dt>_d<D>``, ``tvm_prefill_ragged_<dt>_d<D>`` and ``tvm_decode_<dt>_d<D>``
with exactly the argument lists TVM 0.27's runtime passes to those slots
(src/runtime/vm/attn_backend.h, TIRPagedPrefillFunc / TIRRaggedPrefillFunc / TIRDecodeFunc):

* paged prefill: (q [n, Hq, D], qo_indptr [B+1], pages [P, 2, Hkv, S, D], page_indptr [B+1],
  page_indices [nnz], length_info [B] (last page lengths), k_rope_pos_offset [B],
  q_rope_position [n], o [n, Hq, D], lse [n, Hq], causal, rotary_mode, rope_scale, rope_theta,
  sm_scale)
* ragged prefill: (q, qo_indptr, k [m, Hkv, D], v, kv_indptr [B+1], q_rope_position,
  k_rope_pos_offset, o, lse, causal, rotary_mode, rope_scale, rope_theta, sm_scale)
* decode: (q [B, Hq, D], pages, page_indptr, page_indices, length_info, k_rope_pos_offset,
  q_rope_position, o, lse, rotary_mode, rope_scale, rope_theta, sm_scale)

They run attngen's prefill and tensor-core decode templates with the variant's hooks; TVM's
``causal`` flag applies on top of the variant's mask (in-call positions, as TVM's own kernels
use); rows that see no key store lse = -5e4 as TVM expects. TVM passes no variant parameters,
so scalar parameters are compiled in (``BuildConfig.tvm_constants`` or their defaults) and
tensor parameters are refused. Refused too, at build time: sum-state variants and output
transforms (TVM merges a row's parts by lse), and hooks that read positions or the batch
index (TVM calls a slot per prefix depth, where neither means what the variant expects).
At run time: inline RoPE (rotary_mode 1) and sliding-window length_info [3, B] raise.
The grid of the prefill functions is sized from the query rows (TVM gives no host copy of
qo_indptr); decode splits keys evenly by a batch-size heuristic into a per-device workspace.
"""
from __future__ import annotations

from attngen.ir import ConfigError, ScalarParam, StateAlgebra, TensorParam
from attngen.schedules.build_config import symbol

from .cuda_variant import C_TYPES

SLOT_KINDS = ("tvm_prefill_paged", "tvm_prefill_ragged", "tvm_decode")


def check_tvm_slot_variant(variant, constants: dict) -> None:
    """Refuse, at build time, variants whose results inside TVM's cache would be silently wrong."""
    name = variant.name
    if variant.state != StateAlgebra.SOFTMAX:
        raise ConfigError(f"variant '{name}': TVM's PagedKVCache merges the parts of a row by lse, and this "
                          "variant's state is an unnormalised sum; use a softmax variant for kernels=('tvm',)")
    if "output_transform" in variant.hooks:
        raise ConfigError(f"variant '{name}', hook 'output_transform': TVM's PagedKVCache merges per-part "
                          "outputs, and a per-part output transform does not compose; apply it in the model")
    for hook, reads in variant.analysis.reads.items():
        bad = sorted(set(reads.indices) & {"batch", "qo_pos", "kv_pos"})
        if bad:
            raise ConfigError(f"variant '{name}', hook '{hook}': reads {bad}; TVM calls an attention slot per "
                              "prefix depth, where the batch index and in-call positions are not the sequence's, "
                              "so the CUDA slots serve position-free variants (use the CPU slots for others)")
    for p in variant.params:
        if isinstance(p, TensorParam):
            raise ConfigError(f"variant '{name}': tensor parameter '{p.name}' cannot be passed through TVM's "
                              "slot calls; the CUDA slots serve variants with scalar parameters only")
        if p.name not in constants and p.default is None:
            raise ConfigError(f"variant '{name}': scalar parameter '{p.name}' has no default; give its value "
                              "in tvm_constants")
    unknown = sorted(set(constants) - {p.name for p in variant.params})
    if unknown:
        raise ConfigError(f"tvm_constants: {unknown} are not parameters of variant '{name}'")


def _constants(variant, constants: dict) -> str:
    lines = []
    for p in variant.params:
        if isinstance(p, ScalarParam):
            value = constants.get(p.name, p.default)
            lines.append(f"  hp.{p.name} = static_cast<{C_TYPES[p.dtype]}>({value!r});")
    return "\n".join(lines)


_COMMON_CHECKS = """  if (rotary_mode != 0)
    TVM_FFI_THROW(ValueError) << "{name}: rotary_mode " << rotary_mode << " (inline RoPE) is not served by "
        "attngen's CUDA slots; create the cache with RoPE applied before attention (RopeMode NORMAL or NONE)";"""


def tvm_slot_wrappers(variant, head_dim: int, dtype: str, constants: dict) -> str:
    """C++ source of the three slot functions for one (head_dim, dtype); needs prefill.cuh and
    decode_launch.cuh."""
    t = C_TYPES[dtype]
    fill = _constants(variant, constants)
    out = []
    for kind in SLOT_KINDS:
        name = symbol(kind, dtype, head_dim)
        checks = _COMMON_CHECKS.format(name=name)
        if kind == "tvm_decode":
            out.append(f"""
static void {name}(tvm::ffi::TensorView q, tvm::ffi::TensorView pages, tvm::ffi::TensorView indptr,
    tvm::ffi::TensorView indices, tvm::ffi::TensorView last_page_len, tvm::ffi::TensorView k_rope_pos_offset,
    tvm::ffi::TensorView q_rope_position, tvm::ffi::TensorView o, tvm::ffi::TensorView lse, int64_t rotary_mode,
    double rope_scale, double rope_theta, double sm_scale) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {t};
{checks}
  attngen::check_tensor(q, "q", 3, {{kDLFloat, 16, 1}});
  attngen::check_tensor(pages, "pages", 5, {{kDLFloat, 16, 1}});
  if (last_page_len.ndim() != 1)
    TVM_FFI_THROW(ValueError) << "{name}: length_info must be [batch] (sliding-window length_info is not served)";
  V::Params hp{{}};
{fill}
  attngen::DecodeProblem P{{}};
  P.q = attngen::data_of(q);
  P.o = attngen::data_of(o);
  P.lse = static_cast<float*>(attngen::data_of(lse));
  P.batch = static_cast<int>(q.size(0));
  P.num_qo_heads = static_cast<int>(q.size(1));
  P.num_kv_heads = static_cast<int>(pages.size(2));
  P.group = P.num_qo_heads / P.num_kv_heads;
  if (P.group * P.num_kv_heads != P.num_qo_heads || P.group > 8)
    TVM_FFI_THROW(ValueError) << "{name}: " << P.num_qo_heads << " query heads over " << P.num_kv_heads
                              << " KV heads; groups of 1 to 8 are served";
  if (P.batch == 0) return;
  P.sm_scale = static_cast<float>(sm_scale);
  P.backend = attngen::kDecodeTensorCores;
  P.tvm_conventions = 1;
  cudaStream_t stream = attngen::stream_of(q);  // also makes q's device current for what follows
  P.num_chunks = attngen::even_decode_chunks(P.batch, P.num_kv_heads);
  if (P.num_chunks > 1) {{
    float* ws = attngen::device_scratch(size_t(P.batch) * P.num_chunks * P.num_qo_heads * ({head_dim} + 1));
    if (ws == nullptr)
      TVM_FFI_THROW(RuntimeError) << "{name}: could not allocate the split-KV scratch buffer on the GPU";
    P.part_o = ws;
    P.part_lse = ws + size_t(P.batch) * P.num_chunks * P.num_qo_heads * {head_dim};
  }}
  P.kv.base = attngen::data_of(pages);
{_paged_fill_hnd("P.kv")}
  if (!attngen::launch_decode<V, T, {head_dim}, 8>(P, hp, stream))
    TVM_FFI_THROW(ValueError) << "{name}: no decode tile fits this device's shared memory";
  attngen::check_launch("{name}");
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
""")
            continue
        if kind == "tvm_prefill_paged":
            kv_args = ("tvm::ffi::TensorView pages, tvm::ffi::TensorView indptr, tvm::ffi::TensorView indices, "
                       "tvm::ffi::TensorView last_page_len, tvm::ffi::TensorView k_rope_pos_offset, "
                       "tvm::ffi::TensorView q_rope_position")
            kv_fill = f"""  attngen::check_tensor(pages, "pages", 5, {{kDLFloat, 16, 1}});
  if (last_page_len.ndim() != 1)
    TVM_FFI_THROW(ValueError) << "{name}: length_info must be [batch] (sliding-window length_info is not served)";
  P.num_kv_heads = static_cast<int>(pages.size(2));
  P.kv.base = attngen::data_of(pages);
{_paged_fill_hnd("P.kv")}"""
        else:
            kv_args = ("tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView kv_indptr, "
                       "tvm::ffi::TensorView q_rope_position, tvm::ffi::TensorView k_rope_pos_offset")
            kv_fill = """  attngen::check_tensor(k, "k", 3, {kDLFloat, 16, 1});
  attngen::check_tensor(v, "v", 3, {kDLFloat, 16, 1});
  if (k.stride(0) != v.stride(0) || k.stride(1) != v.stride(1))
    TVM_FFI_THROW(ValueError) << "k, v: must have the same strides";
  P.num_kv_heads = static_cast<int>(k.size(1));
  P.kv.base = attngen::data_of(k);
  P.kv.indptr = static_cast<const int32_t*>(attngen::data_of(kv_indptr));
  P.kv.stride_kv = (static_cast<const char*>(attngen::data_of(v)) - static_cast<const char*>(attngen::data_of(k))) /
                   int64_t(sizeof(T));
  P.kv.stride_slot = k.stride(0);
  P.kv.stride_head = k.stride(1);
  P.kv.page_size = 0;"""
        out.append(f"""
static void {name}(tvm::ffi::TensorView q, tvm::ffi::TensorView qo_indptr, {kv_args}, tvm::ffi::TensorView o,
    tvm::ffi::TensorView lse, int64_t causal, int64_t rotary_mode, double rope_scale, double rope_theta,
    double sm_scale) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {t};
{checks}
  attngen::check_tensor(q, "q", 3, {{kDLFloat, 16, 1}});
  V::Params hp{{}};
{fill}
  attngen::PrefillProblem P{{}};
  P.q = attngen::data_of(q);
  P.o = attngen::data_of(o);
  P.lse = static_cast<float*>(attngen::data_of(lse));
  P.qo_indptr = static_cast<const int32_t*>(attngen::data_of(qo_indptr));
  P.batch = static_cast<int>(qo_indptr.size(0)) - 1;
  P.num_qo_heads = static_cast<int>(q.size(1));
  P.sm_scale = static_cast<float>(sm_scale);
  P.causal = causal != 0;
  P.tvm_conventions = 1;
{kv_fill}
  P.group = P.num_qo_heads / P.num_kv_heads;
  if (P.group * P.num_kv_heads != P.num_qo_heads)
    TVM_FFI_THROW(ValueError) << "{name}: num_qo_heads " << P.num_qo_heads << " is not a multiple of num_kv_heads "
                              << P.num_kv_heads;
  // TVM gives no host copy of qo_indptr: size the grid for the longest possible request (all rows);
  // query tiles past a request's rows exit at once
  attngen::launch_prefill<V, T, {head_dim}>(P, static_cast<int>(q.size(0)), hp, attngen::stream_of(q));
  attngen::check_launch("{name}");
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
""")
    return "\n".join(out)


def _paged_fill_hnd(into: str) -> str:
    """TVM's pages [P, 2, Hkv, S, D] are attngen's HND layout."""
    from .cuda_library import _paged_fill

    return _paged_fill("HND", into)


def tvm_slot_functions(head_dims, dtypes) -> list[str]:
    """Every function a kernels=("tvm",) library exports: both conventions."""
    return ([symbol(kind, dt, d) for d in head_dims for dt in dtypes for kind in SLOT_KINDS]
            + flashinfer_slot_functions(head_dims, dtypes))


# ---------------------------------------------------------------------------------------------
# the ("flashinfer", run, plan) convention

FI_KINDS = ("tvm_fi_decode_plan", "tvm_fi_decode_run", "tvm_fi_prefill_plan", "tvm_fi_prefill_paged_run",
            "tvm_fi_prefill_ragged_run")


def _fi_prefill_run(name: str, head_dim: int, t: str, fill: str, paged: bool) -> str:
    if paged:
        kv_args = ("tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView indptr, tvm::ffi::TensorView indices, "
                   "tvm::ffi::TensorView last_page_len")
        kv_fill = """  if (layout != 1) TVM_FFI_THROW(ValueError) << "{name}: paged KV must be HND (layout code 1)";
  P.kv.indptr = static_cast<const int32_t*>(attngen::data_of(indptr));
  P.kv.indices = static_cast<const int32_t*>(attngen::data_of(indices));
  P.kv.last_page_len = static_cast<const int32_t*>(attngen::data_of(last_page_len));
  P.kv.stride_page = k.stride(0);
  P.kv.stride_head = k.stride(1);
  P.kv.stride_slot = k.stride(2);
  P.kv.page_size = static_cast<int>(k.size(2));""".replace("{name}", name)
    else:
        kv_args = "tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView kv_indptr"
        kv_fill = """  if (layout != 0) TVM_FFI_THROW(ValueError) << "{name}: ragged K/V must be NHD (layout code 0)";
  P.kv.indptr = static_cast<const int32_t*>(attngen::data_of(kv_indptr));
  P.kv.stride_slot = k.stride(0);
  P.kv.stride_head = k.stride(1);
  P.kv.page_size = 0;""".replace("{name}", name)
    heads = "k.size(1)"
    return f"""
static void {name}(tvm::ffi::TensorView float_ws, tvm::ffi::TensorView int_ws, tvm::ffi::Array<int64_t> plan_info,
    tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v, {kv_args}, tvm::ffi::TensorView o,
    tvm::ffi::TensorView lse, int64_t mask_mode, int64_t layout, int64_t window_left, bool enable_pdl,
    double sm_scale, double rope_rcp_scale, double rope_rcp_theta) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {t};
  if (mask_mode != 0 && mask_mode != 1)
    TVM_FFI_THROW(ValueError) << "{name}: mask mode " << mask_mode << " is not served (0: none, 1: causal)";
  if (window_left != -1) TVM_FFI_THROW(ValueError) << "{name}: sliding windows are not served";
  if (plan_info.size() < 1) TVM_FFI_THROW(ValueError) << "{name}: plan_info is not from this library's plan";
  attngen::check_tensor(q, "q", 3, {{kDLFloat, 16, 1}});
  V::Params hp{{}};
{fill}
  attngen::PrefillProblem P{{}};
  P.q = attngen::data_of(q);
  P.o = attngen::data_of(o);
  P.lse = static_cast<float*>(attngen::data_of(lse));
  P.qo_indptr = static_cast<const int32_t*>(attngen::data_of(qo_indptr));
  P.batch = static_cast<int>(qo_indptr.size(0)) - 1;
  P.num_qo_heads = static_cast<int>(q.size(1));
  P.num_kv_heads = static_cast<int>({heads});
  P.group = P.num_qo_heads / P.num_kv_heads;
  if (P.group * P.num_kv_heads != P.num_qo_heads)
    TVM_FFI_THROW(ValueError) << "{name}: num_qo_heads is not a multiple of num_kv_heads";
  P.sm_scale = static_cast<float>(sm_scale);
  P.causal = mask_mode == 1;
  P.tvm_conventions = 1;
  P.kv.base = attngen::data_of(k);
  P.kv.stride_kv = (static_cast<const char*>(attngen::data_of(v)) - static_cast<const char*>(attngen::data_of(k))) /
                   int64_t(sizeof(T));
{kv_fill}
  attngen::launch_prefill<V, T, {head_dim}>(P, static_cast<int>(plan_info[0]), hp, attngen::stream_of(q));
  attngen::check_launch("{name}");
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
"""


def flashinfer_slot_wrappers(variant, head_dim: int, dtype: str, constants: dict) -> str:
    """C++ of the ("flashinfer", run, plan) functions for one (head_dim, dtype): TVM's runtime calls plan
    once per step with host index arrays (the decode plan is attngen's load-balanced split-KV work list,
    copied from TVM's page-locked buffer into its int workspace) and run per layer with the workspace."""
    from attngen.schedules.cost_model import cost_coefficients

    t = C_TYPES[dtype]
    fill = _constants(variant, constants)
    alpha, beta = cost_coefficients("decode")
    n = {k: symbol(k, dtype, head_dim) for k in FI_KINDS}
    return f"""
#include "decode_plan_pack.h"

// plan_info of the decode plan: [CTAs per KV head, merges, partial states, num_qo_heads]
static tvm::ffi::Array<int64_t> {n["tvm_fi_decode_plan"]}(tvm::ffi::TensorView float_ws,
    tvm::ffi::TensorView int_ws, tvm::ffi::TensorView locked_ws, tvm::ffi::TensorView page_indptr, int64_t batch,
    int64_t num_qo_heads, int64_t num_kv_heads, int64_t page_size, bool enable_cuda_graph, int64_t window_left,
    double logits_soft_cap, int64_t qk_head_dim, int64_t v_head_dim, tvm::ffi::TensorView empty_q,
    tvm::ffi::TensorView empty_kv) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {t};
  const char* name = "{n["tvm_fi_decode_plan"]}";
  if (qk_head_dim != {head_dim} || v_head_dim != {head_dim})
    TVM_FFI_THROW(ValueError) << name << ": built for head_dim {head_dim}, asked for " << qk_head_dim;
  if (window_left != -1 || logits_soft_cap != 0.0)
    TVM_FFI_THROW(ValueError) << name << ": sliding windows and FlashInfer's soft cap are not served (write the "
                                 "soft cap as the variant's logits hook)";
  if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads || num_qo_heads / num_kv_heads > 8)
    TVM_FFI_THROW(ValueError) << name << ": groups of 1 to 8 query heads per KV head are served";
  cudaSetDevice(float_ws.device().device_id);
  const int per_sm = attngen::decode_tc_ctas_per_sm<V, T, {head_dim}>();
  if (per_sm == 0) TVM_FFI_THROW(ValueError) << name << ": no tensor-core decode tile fits this device";
  const int ctas = std::max<int>(1, per_sm * attngen::device_sm_count() / int(num_kv_heads));
  const int32_t* ip = static_cast<const int32_t*>(attngen::data_of(page_indptr));
  std::vector<int32_t> qo_len(batch, 1), kv_len(batch);
  for (int64_t b = 0; b < batch; ++b) kv_len[b] = (ip[b + 1] - ip[b]) * int32_t(page_size);  // keys <= pages x size
  attngen::PlanInput in{{qo_len.data(), kv_len.data(), int(batch), int(num_qo_heads / num_kv_heads), 16, ctas,
                        {alpha!r}, {beta!r}, 0, false, false, 0, 0, 256}};
  attngen::Plan p;
  try {{
    p = attngen::plan_split_kv(in, {{batch + ctas, batch + ctas, batch}});
  }} catch (const std::exception& e) {{
    TVM_FFI_THROW(ValueError) << name << ": " << e.what();
  }}
  const int64_t ints = attngen::pack_decode_plan(p, ctas, nullptr);
  const int64_t partials = int64_t(p.merge_partials.size());
  if (int_ws.numel() * (int_ws.dtype().bits / 8) < ints * 4 || locked_ws.numel() * (locked_ws.dtype().bits / 8) < ints * 4)
    TVM_FFI_THROW(ValueError) << name << ": the int workspaces hold fewer than the plan's " << ints * 4 << " bytes";
  if (float_ws.numel() * (float_ws.dtype().bits / 8) < partials * num_qo_heads * ({head_dim} + 1) * 4)
    TVM_FFI_THROW(ValueError) << name << ": the float workspace is smaller than the plan's partial states";
  int32_t* host = static_cast<int32_t*>(attngen::data_of(locked_ws));
  attngen::pack_decode_plan(p, ctas, host);
  cudaMemcpyAsync(attngen::data_of(int_ws), host, size_t(ints) * 4, cudaMemcpyHostToDevice,
                  attngen::stream_of(float_ws));
  return tvm::ffi::Array<int64_t>({{int64_t(ctas), int64_t(p.merge_request.size()), partials, num_qo_heads}});
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({n["tvm_fi_decode_plan"]}, {n["tvm_fi_decode_plan"]});

static void {n["tvm_fi_decode_run"]}(tvm::ffi::TensorView float_ws, tvm::ffi::TensorView int_ws,
    tvm::ffi::Array<int64_t> plan_info, tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v,
    tvm::ffi::TensorView indptr, tvm::ffi::TensorView indices, tvm::ffi::TensorView last_page_len,
    tvm::ffi::TensorView o, tvm::ffi::TensorView lse, int64_t layout, int64_t window_left, bool enable_pdl,
    double sm_scale, double rope_rcp_scale, double rope_rcp_theta) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {t};
  const char* name = "{n["tvm_fi_decode_run"]}";
  if (layout != 1) TVM_FFI_THROW(ValueError) << name << ": paged KV must be HND (layout code 1)";
  if (window_left != -1) TVM_FFI_THROW(ValueError) << name << ": sliding windows are not served";
  if (plan_info.size() != 4 || plan_info[3] != q.size(1))
    TVM_FFI_THROW(ValueError) << name << ": plan_info is not from this library's decode plan for these heads";
  attngen::check_tensor(q, "q", 3, {{kDLFloat, 16, 1}});
  attngen::check_tensor(k, "k", 4, {{kDLFloat, 16, 1}});
  V::Params hp{{}};
{fill}
  attngen::DecodeProblem P{{}};
  P.q = attngen::data_of(q);
  P.o = attngen::data_of(o);
  P.lse = static_cast<float*>(attngen::data_of(lse));
  P.batch = static_cast<int>(q.size(0));
  P.num_qo_heads = static_cast<int>(q.size(1));
  P.num_kv_heads = static_cast<int>(k.size(1));
  P.group = P.num_qo_heads / P.num_kv_heads;
  if (P.batch == 0) return;
  P.sm_scale = static_cast<float>(sm_scale);
  P.num_chunks = 1;
  P.backend = attngen::kDecodeTensorCores;
  P.tvm_conventions = 1;
  P.plan = static_cast<const int32_t*>(attngen::data_of(int_ws));
  P.plan_ctas = static_cast<int>(plan_info[0]);
  P.plan_max_merges = static_cast<int>(plan_info[1]);
  P.part_o = static_cast<float*>(attngen::data_of(float_ws));
  P.part_lse = P.part_o + plan_info[2] * P.num_qo_heads * {head_dim};
  P.kv.base = attngen::data_of(k);
  P.kv.indptr = static_cast<const int32_t*>(attngen::data_of(indptr));
  P.kv.indices = static_cast<const int32_t*>(attngen::data_of(indices));
  P.kv.last_page_len = static_cast<const int32_t*>(attngen::data_of(last_page_len));
  P.kv.stride_page = k.stride(0);
  P.kv.stride_kv = (static_cast<const char*>(attngen::data_of(v)) - static_cast<const char*>(attngen::data_of(k))) /
                   int64_t(sizeof(T));
  P.kv.stride_head = k.stride(1);
  P.kv.stride_slot = k.stride(2);
  P.kv.page_size = static_cast<int>(k.size(2));
  if (!attngen::launch_decode<V, T, {head_dim}, 8>(P, hp, attngen::stream_of(q)))
    TVM_FFI_THROW(ValueError) << name << ": no tensor-core decode tile fits this device";
  attngen::check_launch(name);
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({n["tvm_fi_decode_run"]}, {n["tvm_fi_decode_run"]});

// plan_info of the prefill plan: [longest request's query rows] (sizes the grid; no split-KV)
static tvm::ffi::Array<int64_t> {n["tvm_fi_prefill_plan"]}(tvm::ffi::TensorView float_ws,
    tvm::ffi::TensorView int_ws, tvm::ffi::TensorView locked_ws, tvm::ffi::TensorView qo_indptr,
    tvm::ffi::TensorView kv_indptr, tvm::ffi::TensorView kv_len, int64_t total_qo_len, int64_t batch,
    int64_t num_qo_heads, int64_t num_kv_heads, int64_t page_size, bool enable_cuda_graph, int64_t qk_head_dim,
    int64_t v_head_dim, bool causal, int64_t window_left, int64_t fixed_split_size, bool disable_split_kv,
    int64_t num_colocated_ctas) {{
  if (qk_head_dim != {head_dim} || v_head_dim != {head_dim})
    TVM_FFI_THROW(ValueError) << "{n["tvm_fi_prefill_plan"]}: built for head_dim {head_dim}";
  if (window_left != -1) TVM_FFI_THROW(ValueError) << "{n["tvm_fi_prefill_plan"]}: sliding windows are not served";
  const int32_t* qo = static_cast<const int32_t*>(attngen::data_of(qo_indptr));
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) longest = std::max<int64_t>(longest, qo[b + 1] - qo[b]);
  return tvm::ffi::Array<int64_t>({{longest}});
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({n["tvm_fi_prefill_plan"]}, {n["tvm_fi_prefill_plan"]});
""" + _fi_prefill_run(n["tvm_fi_prefill_paged_run"], head_dim, t, fill, True) + _fi_prefill_run(
        n["tvm_fi_prefill_ragged_run"], head_dim, t, fill, False)


def flashinfer_slot_functions(head_dims, dtypes) -> list[str]:
    return [symbol(kind, dt, d) for d in head_dims for dt in dtypes for kind in FI_KINDS]
