"""CUDA functions with TVM PagedKVCache's attention-slot calling conventions.

Two conventions, both exported by a ``kernels=("tvm",)`` library: ("tirx", fn) (below) and
("flashinfer", run, plan) (``flashinfer_slot_wrappers``: TVM plans once per step with host
index arrays; attngen's decode plan is its load-balanced split-KV work list, packed into TVM's
page-locked buffer and copied to its int workspace; prefill's plan records the longest
request so the grid fits the batch, and makes a paged step of one query per request a split-KV
decode plan that the paged prefill run executes on the decode template: TVM routes decode steps
of GQA groups >= 4 through paged prefill in this convention).

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
qo_indptr); the "tirx" decode splits keys evenly by a batch-size heuristic into a per-device
workspace, the "flashinfer" decode (and decode steps sent through paged prefill) follows the plan.
"""
from __future__ import annotations

from attngen.ir import ConfigError, ScalarParam, TensorParam
from attngen.schedules.build_config import symbol

from .cuda_variant import C_TYPES

SLOT_KINDS = ("tvm_prefill_paged", "tvm_prefill_ragged", "tvm_decode")


def check_tvm_slot_variant(variant, constants: dict) -> None:
    """Refuse, at build time, variants whose results inside TVM's cache would be silently wrong: what the
    CPU slots refuse (cpu/tvm_slots.py), and hooks reading positions or tensor parameters."""
    from .cpu.tvm_slots import check_slot_variant

    name = variant.name
    check_slot_variant(variant)
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


_ROTARY_CHECK = """  if (rotary_mode != 0)
    TVM_FFI_THROW(ValueError) << "{name}: rotary_mode " << rotary_mode << " (inline RoPE) is not served by "
        "attngen's CUDA slots; create the cache with RoPE applied before attention (RopeMode NORMAL or NONE)";"""
_LENGTH_INFO_CHECK = """  if (last_page_len.ndim() != 1)
    TVM_FFI_THROW(ValueError) << "{name}: length_info must be [batch] (sliding-window length_info is not served)";"""


def _export(name: str, signature: str, body: str) -> str:
    return f"""
static {signature} {{
{body}
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});
"""


def _prologue(head_dim: int, t: str, fill: str, checks: str) -> str:
    """The start of every TVM-convention function body: the hook and element types, the argument checks and
    the variant's compiled-in parameters."""
    return f"""  using V = attngen_gen::Hooks_d{head_dim};
  using T = {t};
{checks}
  V::Params hp{{}};
{fill}"""


def _decode_body(name: str, head_dim: int, t: str, fill: str, checks: str, kv_heads: str, split: str) -> str:
    """Body of a TVM-convention decode function on the tensor-core template: ``kv_heads`` fills P.kv and
    gives the KV head count, ``split`` sets the split-KV fields once the stream (and device) is current."""
    return _prologue(head_dim, t, fill, checks) + f"""
  attngen::DecodeProblem P{{}};
  attngen::fill_decode(P, q, o, lse, sm_scale, {kv_heads}, "{name}");
  if (P.group > 8)
    TVM_FFI_THROW(ValueError) << "{name}: " << P.num_qo_heads << " query heads over " << P.num_kv_heads
                              << " KV heads; groups of 1 to 8 are served";
  if (P.batch == 0) return;
  P.backend = attngen::kDecodeTensorCores;
  P.tvm_conventions = 1;
  cudaStream_t stream = attngen::stream_of(q);  // also makes q's device current for what follows
{split}
  if (!attngen::launch_decode<V, T, {head_dim}, 8>(P, hp, stream))
    TVM_FFI_THROW(ValueError) << "{name}: no tensor-core decode tile fits this device's shared memory";
  attngen::check_launch("{name}");"""


def _prefill_body(name: str, head_dim: int, t: str, fill: str, checks: str, kv_heads: str, causal: str,
                  max_qo_len: str) -> str:
    """Body of a TVM-convention prefill function: TVM's causal flag on top of the variant's mask, lse -5e4."""
    return _prologue(head_dim, t, fill, checks) + f"""
  attngen::PrefillProblem P{{}};
  attngen::fill_prefill(P, q, qo_indptr, o, lse, sm_scale, {kv_heads}, "{name}");
  P.causal = {causal};
  P.tvm_conventions = 1;
  attngen::launch_prefill<V, T, {head_dim}>(P, static_cast<int>({max_qo_len}), hp, attngen::stream_of(q));
  attngen::check_launch("{name}");"""


_SPLIT_EVEN = """  P.num_chunks = attngen::even_decode_chunks(P.batch, P.num_kv_heads);
  if (P.num_chunks > 1) {{
    float* ws = attngen::device_scratch(size_t(P.batch) * P.num_chunks * P.num_qo_heads * ({head_dim} + 1));
    if (ws == nullptr)
      TVM_FFI_THROW(RuntimeError) << "{name}: could not allocate the split-KV scratch buffer on the GPU";
    P.part_o = ws;
    P.part_lse = ws + size_t(P.batch) * P.num_chunks * P.num_qo_heads * {head_dim};
  }}"""
# the decode plan's fields start at plan_info[{first}]: CTAs per KV head, merges, partial states
_SPLIT_PLANNED = """  P.num_chunks = 1;
  P.plan = static_cast<const int32_t*>(attngen::data_of(int_ws));
  P.plan_ctas = static_cast<int>(plan_info[{first}]);
  P.plan_max_merges = static_cast<int>(plan_info[{first} + 1]);
  P.part_o = static_cast<float*>(attngen::data_of(float_ws));
  P.part_lse = P.part_o + plan_info[{first} + 2] * P.num_qo_heads * {head_dim};"""
_PAGES = "attngen::kv_from_pages(P.kv, pages, true, indptr, indices, last_page_len)"  # TVM's pages are HND
_TV = "tvm::ffi::TensorView"


def tvm_slot_wrappers(variant, head_dim: int, dtype: str, constants: dict) -> str:
    """C++ source of the three ("tirx", fn) slot functions for one (head_dim, dtype)."""
    t, fill = C_TYPES[dtype], _constants(variant, constants)
    out = []
    for kind in SLOT_KINDS:
        name = symbol(kind, dtype, head_dim)
        rotary = _ROTARY_CHECK.format(name=name)
        if kind == "tvm_decode":
            sig = (f"void {name}({_TV} q, {_TV} pages, {_TV} indptr, {_TV} indices, {_TV} last_page_len, "
                   f"{_TV} k_rope_pos_offset, {_TV} q_rope_position, {_TV} o, {_TV} lse, int64_t rotary_mode, "
                   "double rope_scale, double rope_theta, double sm_scale)")
            body = _decode_body(name, head_dim, t, fill, rotary + "\n" + _LENGTH_INFO_CHECK.format(name=name),
                                _PAGES, _SPLIT_EVEN.format(name=name, head_dim=head_dim))
        else:
            paged = kind == "tvm_prefill_paged"
            kv_args = (f"{_TV} pages, {_TV} indptr, {_TV} indices, {_TV} last_page_len, {_TV} k_rope_pos_offset, "
                       f"{_TV} q_rope_position" if paged else
                       f"{_TV} k, {_TV} v, {_TV} kv_indptr, {_TV} q_rope_position, {_TV} k_rope_pos_offset")
            sig = (f"void {name}({_TV} q, {_TV} qo_indptr, {kv_args}, {_TV} o, {_TV} lse, int64_t causal, "
                   "int64_t rotary_mode, double rope_scale, double rope_theta, double sm_scale)")
            checks = rotary + ("\n" + _LENGTH_INFO_CHECK.format(name=name) if paged else "")
            # TVM gives no host copy of qo_indptr: the grid is sized for the longest possible request (all
            # rows); query tiles past a request's rows exit at once
            body = _prefill_body(name, head_dim, t, fill, checks,
                                 _PAGES if paged else "attngen::kv_from_ragged<T>(P.kv, k, v, kv_indptr)",
                                 "causal != 0", "q.size(0)")
        out.append(_export(name, sig, body))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# the ("flashinfer", run, plan) convention

# plan_info of a prefill plan that made a decode step (one query per request, paged KV) a split-KV decode:
# [1, CTAs per KV head, merges, partial states, num_qo_heads]
_FI_DECODE_IN_PREFILL_INFO = 5
FI_KINDS = ("tvm_fi_decode_plan", "tvm_fi_decode_run", "tvm_fi_prefill_plan", "tvm_fi_prefill_paged_run",
            "tvm_fi_prefill_ragged_run")
_FI_RUN_TAIL = (f"{_TV} o, {_TV} lse, int64_t {{mode}}layout, int64_t window_left, bool enable_pdl, double sm_scale, "
                "double rope_rcp_scale, double rope_rcp_theta")


def _fi_run_checks(name: str, layout: int, what: str) -> str:
    return f"""  if (layout != {layout}) TVM_FFI_THROW(ValueError) << "{name}: {what} (layout code {layout})";
  if (window_left != -1) TVM_FFI_THROW(ValueError) << "{name}: sliding windows are not served";"""


def _fi_prefill_run(name: str, head_dim: int, t: str, fill: str, paged: bool) -> str:
    kv_args = f"{_TV} indptr, {_TV} indices, {_TV} last_page_len" if paged else f"{_TV} kv_indptr"
    sig = (f"void {name}({_TV} float_ws, {_TV} int_ws, tvm::ffi::Array<int64_t> plan_info, {_TV} q, {_TV} k, "
           f"{_TV} v, {_TV} qo_indptr, {kv_args}, " + _FI_RUN_TAIL.format(mode="mask_mode, int64_t ") + ")")
    checks = _fi_run_checks(name, 1 if paged else 0, "paged KV must be HND" if paged else "ragged K/V must be NHD")
    checks += f"""
  if (mask_mode != 0 && mask_mode != 1)
    TVM_FFI_THROW(ValueError) << "{name}: mask mode " << mask_mode << " is not served (0: none, 1: causal)";
  if (plan_info.size() < 1) TVM_FFI_THROW(ValueError) << "{name}: plan_info is not from this library's plan";"""
    kv = ("attngen::kv_from_page_views<T>(P.kv, k, v, indptr, indices, last_page_len)" if paged
          else "attngen::kv_from_ragged<T>(P.kv, k, v, kv_indptr)")
    body = _prefill_body(name, head_dim, t, fill, checks, kv, "mask_mode == 1", "plan_info[0]")
    if paged:  # TVM runs decode steps of GQA groups >= 4 through paged prefill: the plan may have made them decode
        decode = _decode_body(name, head_dim, t, fill, checks + f"""
  if (plan_info[4] != q.size(1) || q.size(0) != qo_indptr.size(0) - 1)
    TVM_FFI_THROW(ValueError) << "{name}: the decode plan_info is not for this batch and these heads";""",
                              kv, _SPLIT_PLANNED.format(head_dim=head_dim, first=1))
        body = f"""  if (plan_info.size() == {_FI_DECODE_IN_PREFILL_INFO}) {{  // a decode step planned as split-KV decode
{decode}
    return;
  }}
""" + body
    return _export(name, sig, body)


def _fi_decode_run(name: str, head_dim: int, t: str, fill: str) -> str:
    sig = (f"void {name}({_TV} float_ws, {_TV} int_ws, tvm::ffi::Array<int64_t> plan_info, {_TV} q, {_TV} k, "
           f"{_TV} v, {_TV} indptr, {_TV} indices, {_TV} last_page_len, " + _FI_RUN_TAIL.format(mode="") + ")")
    checks = _fi_run_checks(name, 1, "paged KV must be HND") + f"""
  if (plan_info.size() != 4 || plan_info[3] != q.size(1))
    TVM_FFI_THROW(ValueError) << "{name}: plan_info is not from this library's decode plan for these heads";"""
    kv = "attngen::kv_from_page_views<T>(P.kv, k, v, indptr, indices, last_page_len)"
    return _export(name, sig, _decode_body(name, head_dim, t, fill, checks, kv,
                                           _SPLIT_PLANNED.format(head_dim=head_dim, first=0)))


def tvm_slot_functions(head_dims, dtypes) -> list[str]:
    """Every function a kernels=("tvm",) library exports: both conventions."""
    return ([symbol(kind, dt, d) for d in head_dims for dt in dtypes for kind in SLOT_KINDS]
            + flashinfer_slot_functions(head_dims, dtypes))


def flashinfer_slot_wrappers(variant, head_dim: int, dtype: str, constants: dict) -> str:
    """C++ of the ("flashinfer", run, plan) functions for one (head_dim, dtype): TVM's runtime calls plan
    once per step with host index arrays (the decode plan is attngen's load-balanced split-KV work list,
    copied from TVM's page-locked buffer into its int workspace) and run per layer with the workspace."""
    from attngen.schedules.cost_model import DECODE_MIN_CHUNK, cost_coefficients

    t = C_TYPES[dtype]
    fill = _constants(variant, constants)
    alpha, beta = cost_coefficients("decode")
    n = {k: symbol(k, dtype, head_dim) for k in FI_KINDS}
    core = f"{n['tvm_fi_decode_plan']}_core"
    return f"""
#include <array>

#include "decode_plan_pack.h"

// attngen's load-balanced split-KV decode plan for requests of kv_len[b] keys (one query each), packed into
// the page-locked buffer and copied to the int workspace; returns [CTAs per KV head, merges, partial states],
// or all zeros where no tensor-core decode tile fits the device (nothing is planned then).
static std::array<int64_t, 3> {core}(const char* name, tvm::ffi::TensorView float_ws,
    tvm::ffi::TensorView int_ws, tvm::ffi::TensorView locked_ws, const int32_t* kv_len, int64_t batch,
    int64_t num_qo_heads, int64_t num_kv_heads) {{
  using V = attngen_gen::Hooks_d{head_dim};
  using T = {t};
  cudaSetDevice(float_ws.device().device_id);
  const int per_sm = attngen::decode_tc_ctas_per_sm<V, T, {head_dim}>();
  if (per_sm == 0) return {{0, 0, 0}};
  const int ctas = std::max<int>(1, per_sm * attngen::device_sm_count() / int(num_kv_heads));
  attngen::Plan p;
  try {{
    p = attngen::plan_decode(kv_len, int(batch), int(num_qo_heads / num_kv_heads), ctas, {alpha!r}, {beta!r},
                             0, {DECODE_MIN_CHUNK}, {{batch + ctas, batch + ctas, batch}});
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
  return {{int64_t(ctas), int64_t(p.merge_request.size()), partials}};
}}

// plan_info of the decode plan: [CTAs per KV head, merges, partial states, num_qo_heads]
static tvm::ffi::Array<int64_t> {n["tvm_fi_decode_plan"]}(tvm::ffi::TensorView float_ws,
    tvm::ffi::TensorView int_ws, tvm::ffi::TensorView locked_ws, tvm::ffi::TensorView page_indptr, int64_t batch,
    int64_t num_qo_heads, int64_t num_kv_heads, int64_t page_size, bool enable_cuda_graph, int64_t window_left,
    double logits_soft_cap, int64_t qk_head_dim, int64_t v_head_dim, tvm::ffi::TensorView empty_q,
    tvm::ffi::TensorView empty_kv) {{
  const char* name = "{n["tvm_fi_decode_plan"]}";
  if (qk_head_dim != {head_dim} || v_head_dim != {head_dim})
    TVM_FFI_THROW(ValueError) << name << ": built for head_dim {head_dim}, asked for " << qk_head_dim;
  if (window_left != -1 || logits_soft_cap != 0.0)
    TVM_FFI_THROW(ValueError) << name << ": sliding windows and FlashInfer's soft cap are not served (write the "
                                 "soft cap as the variant's logits hook)";
  if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads || num_qo_heads / num_kv_heads > 8)
    TVM_FFI_THROW(ValueError) << name << ": groups of 1 to 8 query heads per KV head are served";
  const int32_t* ip = static_cast<const int32_t*>(attngen::data_of(page_indptr));
  std::vector<int32_t> kv_len(batch);
  for (int64_t b = 0; b < batch; ++b) kv_len[b] = (ip[b + 1] - ip[b]) * int32_t(page_size);  // keys <= pages x size
  const auto info = {core}(name, float_ws, int_ws, locked_ws, kv_len.data(), batch, num_qo_heads, num_kv_heads);
  if (info[0] == 0) TVM_FFI_THROW(ValueError) << name << ": no tensor-core decode tile fits this device";
  return tvm::ffi::Array<int64_t>({{info[0], info[1], info[2], num_qo_heads}});
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({n["tvm_fi_decode_plan"]}, {n["tvm_fi_decode_plan"]});

""" + _fi_decode_run(n["tvm_fi_decode_run"], head_dim, t, fill) + f"""
// plan_info of the prefill plan: [longest request's query rows] (sizes the grid; no split-KV), or, for a paged
// step of one query per request, [1, CTAs per KV head, merges, partial states, num_qo_heads] (a split-KV decode)
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
  // TVM sends decode steps of GQA groups >= 4 through paged prefill (page_size > 1; its ragged plan passes 1):
  // one query per request becomes attngen's split-KV tensor-core decode, whose plan balances long contexts
  // (where the decode tile does not fit the device, the step stays a prefill)
  if (page_size > 1 && batch > 0 && total_qo_len == batch && longest == 1 && num_kv_heads > 0 &&
      num_qo_heads % num_kv_heads == 0 && num_qo_heads / num_kv_heads <= 8) {{
    const auto info = {core}("{n["tvm_fi_prefill_plan"]}", float_ws, int_ws, locked_ws,
        static_cast<const int32_t*>(attngen::data_of(kv_len)), batch, num_qo_heads, num_kv_heads);
    if (info[0] > 0) return tvm::ffi::Array<int64_t>({{1, info[0], info[1], info[2], num_qo_heads}});
  }}
  return tvm::ffi::Array<int64_t>({{longest}});
}}
TVM_FFI_DLL_EXPORT_TYPED_FUNC({n["tvm_fi_prefill_plan"]}, {n["tvm_fi_prefill_plan"]});
""" + _fi_prefill_run(n["tvm_fi_prefill_paged_run"], head_dim, t, fill, True) + _fi_prefill_run(
        n["tvm_fi_prefill_ragged_run"], head_dim, t, fill, False)


def flashinfer_slot_functions(head_dims, dtypes) -> list[str]:
    return [symbol(kind, dt, d) for d in head_dims for dt in dtypes for kind in FI_KINDS]
