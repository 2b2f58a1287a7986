"""CUDA functions with TVM PagedKVCache's attention-slot calling conventions: what a build instantiates.

The functions are C++ templates in ``attngen/csrc``: ``tvm_slots.h`` (the ("tirx", fn) slots) and
``tvm_fi_slots.h`` (the ("flashinfer", run, plan) slots: TVM plans once per step with host index
arrays; attngen's decode plan is its load-balanced split-KV work list, packed into TVM's
page-locked buffer and copied to its int workspace; prefill's plan records the longest request so
the grid fits the batch, and makes a paged step of one query per request a split-KV decode plan
that the paged prefill run executes on the decode template: TVM routes decode steps of GQA groups
>= 4 through paged prefill in this convention). This module writes, per (head_dim, dtype), only
what the templates cannot know: a small ``Config`` struct (the variant's parameters: scalars
compiled in, tensors from the trailing arguments, csrc/tvm_slot_params.h; the exported names the
errors cite, the decode cost model) and the export lines.

The CUDA library built with ``kernels=("tvm", ...)`` exports, per (head_dim, dtype),
``tvm_prefill_paged_<dt>_d<D>``, ``tvm_prefill_ragged_<dt>_d<D>``, ``tvm_decode_<dt>_d<D>``, the
token-tree slots and the sliding-window slots ``tvm_prefill_paged_sliding_window_<dt>_d<D>`` / ``tvm_decode_sliding_window_<dt>_d<D>``
with exactly the argument lists TVM 0.27's runtime passes to those slots
(src/runtime/vm/attn_backend.h, TIRPagedPrefillFunc / TIRRaggedPrefillFunc / TIRDecodeFunc and the
tree-mask functions):

* paged prefill: (q [n, Hq, D], qo_indptr [B+1], pages [P, 2, Hkv, S, D], page_indptr [B+1],
  page_indices [nnz], length_info [B] (last page lengths), k_rope_pos_offset [B],
  q_rope_position [n], o [n, Hq, D], lse [n, Hq], causal, rotary_mode, rope_scale, rope_theta,
  sm_scale)
* ragged prefill: (q, qo_indptr, k [m, Hkv, D], v, kv_indptr [B+1], q_rope_position,
  k_rope_pos_offset, o, lse, causal, rotary_mode, rope_scale, rope_theta, sm_scale)
* decode: (q [B, Hq, D], pages, page_indptr, page_indices, length_info, k_rope_pos_offset,
  q_rope_position, o, lse, rotary_mode, rope_scale, rope_theta, sm_scale)
* the sliding-window forms: the paged prefill's and the decode's lists with length_info [3, B]
  = (last page lengths, window offsets, sink sizes). Request b's keys are its sink rows, then its
  rows from the window offset on: key j lies at row j < sink ? j : j - sink + offset of its pages,
  (pages - 1) * page_size + last - offset + sink keys in all. ``BuildConfig.tvm_window`` W > 0 (the
  window of "mha_sliding" layers) also hides key j from the query of position p unless
  p - (k_rope_pos_offset[b] + j) < W, at TVM's positions (q_rope_position per query row), and
  prefill's ``causal`` compares those positions too; with W = 0 (per-sequence windows) no position
  is read. The kernels are instances of the templates with that view and mask compiled in
  (``TvmWindowed`` traits, csrc/tvm_window.cuh), built only where tvm_window is given; without it
  the two functions refuse a call by name.
* the token-tree slots (speculative decoding; TVM 0.27's TIRRaggedPrefillTreeMaskFunc and
  TIRPagedPrefillTreeMaskFunc), ``tvm_prefill_ragged_tree_<dt>_d<D>``: (q, qo_indptr, k, v, kv_indptr,
  q_rope_position, tree_mn_indptr [B+1], tree_order [nodes, 2], o, lse, rotary_mode, rope_scale,
  rope_theta, sm_scale), and ``tvm_prefill_paged_tree_<dt>_d<D>``: the paged prefill's list without
  ``causal``, then tree_mn_indptr and tree_order. Request b's tree is its last
  tree_mn_indptr[b+1] - tree_mn_indptr[b] keys, its query rows the tree's last nodes; a query sees
  every key before the tree and, inside it, its own node and its ancestors (tree_order's (DFS order,
  end of subtree) pairs), and what the variant's mask admits. They run instances of the mma.sync
  prefill template with that mask compiled in (``TvmTree`` traits, csrc/tvm_tree.cuh). The paged one
  reads length_info [B], or [3, B] on "mha_sliding" layers (the sliding-window view and the layer
  window at TVM's positions) in a library built for the layer window; elsewhere it refuses that call.

and ``tvm_fi_{decode_plan, decode_run, prefill_plan, prefill_paged_run, prefill_ragged_run}_<dt>_d<D>``
with FlashInfer's plan and run argument lists.

They run attngen's prefill and tensor-core decode templates with the variant's hooks; TVM's
``causal`` flag applies on top of the variant's mask (in-call positions, as TVM's own kernels
use); rows that see no key store lse = -5e4 as TVM expects. TVM passes no variant parameters,
so scalar parameters are compiled in (``BuildConfig.tvm_constants`` or their defaults), and a
variant with tensor parameters makes every function but the two "flashinfer" plans take them as
trailing TensorView arguments after TVM's, in declaration order (attngen.tvm binds them to each
call); each is checked per call before any kernel runs: element type, rank, contiguity, on q's
GPU, and its declared dims against the call (``num_qo_heads`` / ``num_kv_heads`` / ``head_dim`` /
numbers exactly, ``batch_size`` / ``total_q`` and ``name>=B`` at least: TVM calls a slot per
prefix depth with part of the batch). Variants without tensor parameters keep TVM's argument
lists exactly. Refused at build time: sum-state variants and output transforms (TVM merges a
row's parts by lse), and hooks that read positions or the batch index (TVM calls a slot per
prefix depth, where neither means what the variant expects).
* inline RoPE (TVM's RopeMode INLINE, rotary_mode 1), in libraries built with ``BuildConfig.tvm_rope``:
  the paged and ragged prefill, decode and sliding-window functions rotate each query row at
  q_rope_position and key j of request b at k_rope_pos_offset[b] + j (j in the sliding-window view)
  by TVM's rotate-half RoPE with the call's rope_scale and rope_theta, before the variant's
  transforms. The kernels are instances with the rotation compiled in (``TvmRope`` traits,
  csrc/tvm_rope.cuh) on the mma.sync prefill and tensor-core decode templates, built only there;
  elsewhere rotary_mode 1 raises. The token-tree functions refuse it always (as TVM's cache does).

At run time: length_info [3, B] in the plain slots raises.
The grid of the prefill functions is sized from the query rows (TVM gives no host copy of
qo_indptr); the "tirx" decode splits keys evenly by a batch-size heuristic into a per-device
workspace, the "flashinfer" decode (and decode steps sent through paged prefill) follows the plan.
"""
from __future__ import annotations

import json
import math

from attngen.ir import ConfigError, ScalarParam, TensorParam
from attngen.ir.declarations import scalar_value
from attngen.schedules.build_config import DTYPE_SHORT, symbol
from attngen.schedules.cost_model import DECODE_TINY_BATCH_CHUNK, cost_coefficients, decode_min_chunk
from attngen.schedules.template_tvm import FLASHINFER_KINDS, SLOT_KINDS

from .cpu.tvm_slots import check_slot_variant
from .cuda_variant import C_TYPES

# exported kind (the tvm record's exports) -> static function of attngen::tvm_slot::TirxSlots (csrc/tvm_slots.h)
# and of attngen::tvm_slot::FlashInferSlots (csrc/tvm_fi_slots.h): the kind without its convention prefix
TIRX_FUNCTIONS = {kind: kind.removeprefix("tvm_") for kind in SLOT_KINDS}
FLASHINFER_FUNCTIONS = {kind: kind.removeprefix("tvm_fi_") for kind in FLASHINFER_KINDS}


def check_tvm_slot_hooks(variant) -> None:
    """Refuse variants whose results inside TVM's cache would be silently wrong: what the CPU slots refuse
    (cpu/tvm_slots.py), and hooks reading positions or the batch index."""
    check_slot_variant(variant)
    for hook, reads in variant.analysis.reads.items():
        bad = sorted(set(reads.indices) & {"batch", "qo_pos", "kv_pos"})
        if bad:
            raise ConfigError(f"variant '{variant.name}', hook '{hook}': reads {bad}; TVM calls an attention slot "
                              "per prefix depth, where the batch index and in-call positions are not the sequence's, "
                              "so the CUDA slots serve position-free variants (use the CPU slots for others)")


def check_tvm_slot_variant(variant, constants: dict) -> None:
    """Refuse, at build time, what ``check_tvm_slot_hooks`` refuses, and ``constants``
    (``BuildConfig.tvm_constants``) that do not give every scalar parameter a value."""
    name = variant.name
    check_tvm_slot_hooks(variant)
    tensors = sorted(p.name for p in variant.params if isinstance(p, TensorParam))
    for p in variant.params:
        if isinstance(p, ScalarParam) and p.name not in constants and p.default is None:
            raise ConfigError(f"variant '{name}': scalar parameter '{p.name}' has no default; give its value "
                              "in tvm_constants")
    bound = sorted(set(constants) & set(tensors))
    if bound:
        raise ConfigError(f"tvm_constants: {bound} are tensor parameters of variant '{name}', which the slot "
                          "functions take as trailing arguments of every call, not compiled in")
    unknown = sorted(set(constants) - {p.name for p in variant.params})
    if unknown:
        raise ConfigError(f"tvm_constants: {unknown} are not parameters of variant '{name}'")
    for p in variant.params:  # compiled in as C++ literals: a value outside the dtype would wrap silently
        if isinstance(p, ScalarParam) and p.name in constants:
            _, problem = scalar_value(p.dtype, constants[p.name])
            if problem:
                raise ConfigError(f"tvm_constants['{p.name}'] ({p.dtype}): {problem}")


def cxx_literal(dtype: str, value) -> str:
    """``value`` (already range-checked for ``dtype``) as a C++ literal: whole numbers as integers, floats
    exactly (hexadecimal), inf and nan by name."""
    v, problem = scalar_value(dtype, value)
    if problem:
        raise ConfigError(f"scalar value {value!r} ({dtype}): {problem}")
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "__builtin_nanf(\"\")"
    if math.isinf(v):
        return "__builtin_inff()" if v > 0 else "(-__builtin_inff())"
    return f"{float(v).hex()}"


def _name_constant(function: str) -> str:
    """The Config member holding a function's exported name: ``prefill_paged`` -> ``kPrefillPaged``."""
    return "k" + "".join(part.capitalize() for part in function.split("_"))


# CALL_SIZES name -> attngen::tvm_slot::CallSize (csrc/tvm_slot_params.h)
_CALL_SIZES = {"batch_size": "kBatchSize", "num_qo_heads": "kNumQoHeads", "num_kv_heads": "kNumKvHeads",
               "head_dim": "kHeadDim", "total_q": "kTotalQ"}


def _declared_dim(dim) -> str:
    """One ``attngen::tvm_slot::DeclaredDim`` initializer: what a TensorParam's dim declares of its length."""
    bound = dim.fixed if dim.fixed is not None else dim.call_size or dim.at_least
    size = _CALL_SIZES[bound] if isinstance(bound, str) else "kNone"
    fixed = bound if isinstance(bound, int) else -1
    return (f"{{{json.dumps(dim.text)}, {fixed}, attngen::tvm_slot::CallSize::{size}, "
            f"{'true' if dim.at_least is not None else 'false'}}}")


def _fill(variant, hooks: str, constants: dict) -> list[str]:
    """The Config's ``TensorArgs`` and ``fill`` (csrc/tvm_slot_params.h): the traits' set_params with the scalar
    parameters as literals and the tensor parameters from the trailing arguments t0, t1, ..., each checked against
    the call."""
    tensors = [p for p in variant.params if isinstance(p, TensorParam)]
    args, checks = [], []
    for p in variant.params:
        if isinstance(p, TensorParam):
            t = f"t{tensors.index(p)}"
            args.append(t)
            dims = ", ".join(_declared_dim(d) for d in p.dims)
            checks.append(f'    attngen::tvm_slot::check_slot_tensor(entry, "{p.name}", {t}, call, {{{dims}}});')
        else:
            args.append(cxx_literal(p.dtype, constants.get(p.name, p.default)))
    views = "".join(f", tvm::ffi::TensorView t{i}" for i in range(len(tensors)))
    return [
        f"  using TensorArgs = attngen::ArgList<{', '.join(['tvm::ffi::TensorView'] * len(tensors))}>;",
        f"  static void fill(const char* entry, {'' if tensors else '[[maybe_unused]] '}const attngen::tvm_slot::"
        f"SlotCall& call, {hooks}::Params& hp{views}) {{",
        f"    {hooks}::set_params(entry, hp{''.join(', ' + a for a in args)});", *checks, "  }"]


def _instantiation(template: str, functions: dict, variant, head_dim: int, dtype: str, constants: dict,
                   extra_members: tuple[str, ...] = ()) -> str:
    """The generated Config of ``template`` (the variant's parameters: ``_fill``, the exported name of every
    function, ``extra_members``), the template's instance for (head_dim, dtype) and its export lines."""
    stem = template.rsplit("::", 1)[-1]
    tag = f"{DTYPE_SHORT[dtype]}_d{head_dim}"
    config, instance = f"{stem}Config_{tag}", f"{stem}_{tag}"
    hooks = f"attngen_gen::Hooks_d{head_dim}"
    names = [f'  static constexpr const char* {_name_constant(fn)} = "{symbol(kind, dtype, head_dim)}";'
             for kind, fn in functions.items()]
    return "\n".join([
        "namespace {",
        "// what TVM's calls do not carry: the variant's parameters (scalars compiled in, tensors trailing TVM's",
        "// arguments) and the exported names",
        f"struct {config} {{",
        *_fill(variant, hooks, constants),
        *names, *extra_members,
        "};",
        f"using {instance} = {template}<{hooks}, {C_TYPES[dtype]}, {head_dim}, {config}>;",
        "}  // namespace",
        *(f"ATTNGEN_EXPORT_TYPED_FUNC({symbol(kind, dtype, head_dim)}, {instance}::{fn});"
          for kind, fn in functions.items()),
    ]) + "\n"


def tvm_slot_wrappers(variant, head_dim: int, dtype: str, constants: dict, window: int | None = None,
                      rope: bool = False) -> str:
    """C++ of the ("tirx", fn) slot functions for one (head_dim, dtype): TirxSlots (csrc/tvm_slots.h)
    instantiated with the variant's compiled-in parameters, what its sliding-window functions serve
    (``window``: ``BuildConfig.tvm_window``; None is -1 there: they refuse a call) and whether it serves
    inline RoPE (``rope``: ``BuildConfig.tvm_rope``), and its exports."""
    served = (f"  static constexpr int kSlidingWindow = {-1 if window is None else int(window)};",
              f"  static constexpr bool kInlineRope = {'true' if rope else 'false'};")
    return "\n" + _instantiation("attngen::tvm_slot::TirxSlots", TIRX_FUNCTIONS, variant, head_dim, dtype,
                                 constants, served)


def flashinfer_slot_wrappers(variant, head_dim: int, dtype: str, constants: dict) -> str:
    """C++ of the ("flashinfer", run, plan) functions for one (head_dim, dtype): FlashInferSlots
    (csrc/tvm_fi_slots.h) instantiated with the variant's compiled-in parameters and the decode cost model
    its plan weighs work with, and its exports."""
    alpha, beta = cost_coefficients("decode")
    cost_model = (f"  static constexpr double kDecodeCostAlpha = {alpha!r};",
                  f"  static constexpr double kDecodeCostBeta = {beta!r};",
                  f"  static constexpr int64_t kDecodeMinChunk = {decode_min_chunk(head_dim)};",
                  f"  static constexpr int64_t kDecodeTinyChunk = {DECODE_TINY_BATCH_CHUNK};")
    return "\n" + _instantiation(
        "attngen::tvm_slot::FlashInferSlots", FLASHINFER_FUNCTIONS, variant, head_dim, dtype, constants, cost_model)


def tvm_slot_functions(head_dims, dtypes) -> list[str]:
    """Every function a kernels=("tvm",) library exports: both conventions."""
    return ([symbol(kind, dt, d) for d in head_dims for dt in dtypes for kind in TIRX_FUNCTIONS]
            + flashinfer_slot_functions(head_dims, dtypes))


def flashinfer_slot_functions(head_dims, dtypes) -> list[str]:
    """The ("flashinfer", run, plan) functions of a kernels=("tvm",) library."""
    return [symbol(kind, dt, d) for d in head_dims for dt in dtypes for kind in FLASHINFER_FUNCTIONS]
