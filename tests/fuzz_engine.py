"""The fuzzer's parts: variants composed from hook fragments, random batches, faults, and the oracle.

A ``Recipe`` picks fragments per hook kind (logits: scale, ALiBi-like bias read from a tensor parameter,
soft-cap; mask: causal, sliding window, a custom mask read from tensor parameters, a head-striped mask, chunked
local attention (positions divided by a parameter);
query / key / output transforms, elementwise or whole-row, one reading a 2-D tensor parameter; softmax or
sum state). ``make_variant`` writes each hook as TVMScript text and parses it. ``make_case`` draws a batch
from a seed (ragged or paged, both layouts, page permutations with spare pages, empty and one-token
requests, GQA, NaN / Inf injected in q, k or v), and ``apply_fault`` spoils one argument of it (malformed
page tables and indptrs, wrong dtypes, devices, layouts, shapes, parameters).

``run_case`` is the oracle: the CPU result equals the float64 reference under the non-finite rules of
``nonfinite.compare_nonfinite``, or the call is refused with one of attngen's own errors whose message names
the argument at fault. Anything else (another exception, a result for a spoilt call, a mismatch) raises
``FuzzFailure``. Used by tests/test_fuzz_cpu.py (a fixed, small number of examples) and
benchmarks/fuzz_long.py (a long run with figures).

The views that build on the prefill (cascade levels, block-sparse layouts, appends) are case kinds of their own,
drawn, spoilt and checked in tests/fuzz_views.py on the pieces here (the paged caches and poisoning at the end of
this file are theirs); its ``make_case`` and ``run_case`` take every kind, these the base kinds alone.
"""
from __future__ import annotations

import faulthandler
import hashlib
import itertools
from dataclasses import dataclass, field, replace

import numpy as np
import tvm.script
from tvm.script import tirx as T

from attngen import ConfigError, ScalarParam, TensorParam, Variant, VariantError
from attngen.runtime import AttentionArgumentError, CPUAttention, PagedKV, RaggedKV, pack_custom_mask
from attngen.runtime.reference import reference_attention
from attngen.testing import random_problem

from .nonfinite import compare_nonfinite

HEAD_DIM = 32
ATTNGEN_ERRORS = (AttentionArgumentError, VariantError, ConfigError)

LOGITS = ("scale", "alibi", "softcap")
MASKS = ("causal", "window", "custom", "stripe", "chunk")
QUERY = ("none", "affine", "reverse")
KEY = ("none", "scale", "swap")
OUTPUT = ("none", "affine", "lse", "head_bias")


class FuzzFailure(AssertionError):
    """The call neither matched the reference nor was refused with attngen's own error."""


@dataclass(frozen=True)
class Recipe:
    logits: tuple[str, ...] = ()  # applied in LOGITS order
    mask: tuple[str, ...] = ()  # all must hold
    query: str = "none"
    key: str = "none"
    output: str = "none"
    state: str = "softmax"

    def __post_init__(self):
        if self.state == "sum" and self.output == "lse":
            object.__setattr__(self, "output", "affine")  # a sum state has no lse to hand the hook

    @property
    def name(self) -> str:
        return "fz_" + hashlib.sha1(repr(self).encode()).hexdigest()[:10]


def all_recipes():
    """Every recipe (for the long run's sampler)."""
    subsets = lambda xs: [tuple(c) for n in range(len(xs) + 1) for c in itertools.combinations(xs, n)]  # noqa: E731
    for lg, mk, q, k, o, st in itertools.product(subsets(LOGITS), subsets(MASKS), QUERY, KEY, OUTPUT,
                                                 ("softmax", "sum")):
        yield Recipe(lg, mk, q, k, o, st)


# ---- variants from fragments ---------------------------------------------------------------------------
def _parse(src: str):
    return tvm.script.from_source(src, extra_vars={"T": T})


def _row_hook(name: str, scalars: str, body: str, extra: str = "", buffers: str = "") -> object:
    src = (f"@T.prim_func\ndef {name}(x_ptr: T.handle, y_ptr: T.handle, {scalars}{extra}):\n"
           f"    d = T.int32()\n    x = T.match_buffer(x_ptr, (d,), 'float32')\n"
           f"    y = T.match_buffer(y_ptr, (d,), 'float32')\n{buffers}{body}")
    return _parse(src)


_RECIPES: dict[str, Recipe] = {}  # variant name -> its recipe (make_variant)


def make_variant(recipe: Recipe) -> Variant:
    _RECIPES[recipe.name] = recipe  # (what a view must refuse follows from the fragments: fuzz_views._view_refuses)
    hooks, params = {}, []
    score_args = "batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32"
    if recipe.logits:
        expr, extra, buffers = "s", "", ""
        if "scale" in recipe.logits:
            expr = f"({expr}) * T.float32(0.75)"
        if "alibi" in recipe.logits:
            expr = f"({expr}) + fz_slopes[qo_head] * T.float32(kv_pos - qo_pos)"
            extra += ", slopes_ptr: T.handle"
            buffers += "    n = T.int32()\n    fz_slopes = T.match_buffer(slopes_ptr, (n,), 'float32')\n"
            params.append(TensorParam("fz_slopes", "float32", ("num_qo_heads",)))
        if "softcap" in recipe.logits:
            expr = f"fz_cap * T.tanh(({expr}) / fz_cap)"
            extra += ", fz_cap: T.float32"
            params.append(ScalarParam("fz_cap", "float32", 4.0))
        hooks["logits_transform"] = _parse(
            f"@T.prim_func\ndef fz_logits(s: T.float32, {score_args}{extra}) -> T.float32:\n{buffers}"
            f"    return {expr}\n")
    if recipe.mask:
        conds, extra, buffers = [], "", ""
        if "causal" in recipe.mask:
            conds.append("kv_pos <= qo_pos")
        if "window" in recipe.mask:
            conds.append("qo_pos - kv_pos < fz_window")
            extra += ", fz_window: T.int32"
            params.append(ScalarParam("fz_window", "int32", 4))
        if "custom" in recipe.mask:
            conds.append("T.bitwise_and(T.shift_right(T.Cast('int32', mask_bits[T.shift_right(idx, 3)]), "
                         "T.bitwise_and(idx, 7)), 1) == 1")
            extra += ", bits_ptr: T.handle, offset_ptr: T.handle, stride_ptr: T.handle"
            buffers += ("    nbytes = T.int32()\n    nbatch = T.int32()\n"
                        "    mask_bits = T.match_buffer(bits_ptr, (nbytes,), 'uint8')\n"
                        "    mask_offset = T.match_buffer(offset_ptr, (nbatch,), 'int32')\n"
                        "    mask_stride = T.match_buffer(stride_ptr, (nbatch,), 'int32')\n"
                        "    idx: T.let = mask_offset[batch] + qo_pos * mask_stride[batch] + kv_pos\n")
            params += [TensorParam("mask_bits", "uint8", ("num_mask_bytes",)),
                       TensorParam("mask_offset", "int32", ("batch_size",)),
                       TensorParam("mask_stride", "int32", ("batch_size",))]
        if "stripe" in recipe.mask:
            conds.append("(kv_pos + qo_head) % 3 != 1")
        if "chunk" in recipe.mask:  # chunked local attention: keys in the query's chunk of fz_chunk positions
            conds.append("qo_pos // fz_chunk == kv_pos // fz_chunk")
            extra += ", fz_chunk: T.int32"
            params.append(ScalarParam("fz_chunk", "int32", 4))
        expr = conds[0]
        for c in conds[1:]:
            expr = f"T.And({expr}, {c})"
        hooks["logits_mask"] = _parse(f"@T.prim_func\ndef fz_mask({score_args}{extra}) -> T.bool:\n{buffers}"
                                      f"    return {expr}\n")
    if recipe.query == "affine":
        hooks["query_transform"] = _row_hook("fz_query", "qo_pos: T.int32, qo_head: T.int32",
                                             "    for i in range(d):\n        y[i] = x[i] * T.float32(1.25) + "
                                             "T.float32(qo_head) * T.float32(0.125)\n")
    elif recipe.query == "reverse":
        hooks["query_transform"] = _row_hook("fz_query", "qo_pos: T.int32, qo_head: T.int32",
                                             "    for i in range(d):\n        y[i] = x[d - 1 - i]\n")
    if recipe.key == "scale":
        hooks["key_transform"] = _row_hook("fz_key", "kv_pos: T.int32, kv_head: T.int32",
                                           "    for i in range(d):\n        y[i] = x[i] * T.float32(0.8)\n")
    elif recipe.key == "swap":
        hooks["key_transform"] = _row_hook("fz_key", "kv_pos: T.int32, kv_head: T.int32",
                                           "    for i in range(d // 2):\n        y[i] = x[i + d // 2]\n"
                                           "    for i in range(d // 2):\n        y[i + d // 2] = x[i]\n")
    out_args = "batch: T.int32, qo_pos: T.int32, qo_head: T.int32, lse: T.float32"
    if recipe.output == "affine":
        hooks["output_transform"] = _row_hook("fz_out", out_args,
                                              "    for i in range(d):\n        y[i] = x[i] * T.float32(2) + "
                                              "T.float32(0.5)\n")
    elif recipe.output == "lse":
        hooks["output_transform"] = _row_hook("fz_out", out_args,
                                              "    for i in range(d):\n        y[i] = x[i] + lse * "
                                              "T.float32(0.03125)\n")
    elif recipe.output == "head_bias":
        hooks["output_transform"] = _row_hook(
            "fz_out", out_args, "    for i in range(d):\n        y[i] = x[i] + fz_obias[qo_head, i]\n",
            extra=", bias_ptr: T.handle",
            buffers="    nh = T.int32()\n    fz_obias = T.match_buffer(bias_ptr, (nh, d), 'float32')\n")
        params.append(TensorParam("fz_obias", "float32", ("num_qo_heads", "head_dim")))
    return Variant(recipe.name, params=params, state=recipe.state, **hooks)


_BUILT: dict[Recipe, tuple[Variant, CPUAttention]] = {}


def built(recipe: Recipe, cache=None) -> tuple[Variant, CPUAttention]:
    """The recipe's variant and its CPU module, built once per process (and once per cache directory)."""
    if recipe not in _BUILT:
        variant = make_variant(recipe)
        kwargs = {"cache": cache} if cache is not None else {}
        _BUILT[recipe] = (variant, CPUAttention.build(variant, head_dims=(HEAD_DIM,), dtypes=("float32",),
                                                      **kwargs))
    return _BUILT[recipe]


# ---- batches -------------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str  # "ragged" | "paged" | "decode", or a view (fuzz_views.VIEW_KINDS): "cascade" | "bsr" | "append"
    q: np.ndarray
    qo_indptr: np.ndarray
    kv: object  # RaggedKV | PagedKV
    keys: list  # per request, for the reference
    values: list
    params: dict
    sm_scale: float
    injected: str = ""  # what non-finite value was written where ("" for none)
    view: dict | None = None  # a view kind's parts (levels, layout, appended rows, ...: see its maker in fuzz_views)
    scales: dict | None = None  # an fp8 cache's k_scale / v_scale (tests/fuzz_fp8.py); None for a float cache


def _params(variant: Variant, rng, qo_lens, kv_lens, n_qo: int, head_dim: int = HEAD_DIM) -> dict:
    out = {}
    names = {p.name for p in variant.params}
    if "fz_slopes" in names:
        out["fz_slopes"] = (rng.standard_normal(n_qo) * 0.3).astype(np.float32)
    if "fz_cap" in names:
        out["fz_cap"] = float(rng.choice([0.5, 4.0, 30.0]))
    if "fz_window" in names:
        out["fz_window"] = int(rng.integers(0, 7))
    if "fz_chunk" in names:
        out["fz_chunk"] = int(rng.integers(1, 9))
    if "mask_bits" in names:
        out.update(pack_custom_mask([rng.random((a, b)) < 0.6 for a, b in zip(qo_lens, kv_lens)], kv_lens))
    if "fz_obias" in names:
        out["fz_obias"] = rng.standard_normal((n_qo, head_dim)).astype(np.float32)
    return out


def _inject(case: Case, rng, qo_lens, kv_lens) -> None:
    """Write NaN, +Inf or -Inf into one or two elements of q, k or v (every copy of the KV)."""
    where = str(rng.choice(["q", "k", "v"]))
    value = float(rng.choice([np.nan, np.inf, -np.inf]))
    spots = []
    for _ in range(int(rng.integers(1, 3))):
        d = int(rng.integers(case.q.shape[2]))
        if where == "q":
            if case.q.shape[0] == 0:
                return
            row, h = int(rng.integers(case.q.shape[0])), int(rng.integers(case.q.shape[1]))
            case.q[row, h, d] = value
            spots.append(f"q[{row},{h},{d}]")
            continue
        nonempty = [b for b, n in enumerate(kv_lens) if n]
        if not nonempty:
            return
        b = int(rng.choice(nonempty))
        j, hk = int(rng.integers(kv_lens[b])), int(rng.integers(case.keys[b].shape[1]))
        half = 0 if where == "k" else 1
        (case.keys if half == 0 else case.values)[b][j, hk, d] = value
        if isinstance(case.kv, RaggedKV):
            (case.kv.k if half == 0 else case.kv.v)[int(case.kv.indptr[b]) + j, hk, d] = value
        else:
            kv = case.kv
            page = kv.indices[kv.indptr[b] + j // kv.page_size]
            if kv.layout == "NHD":
                kv.pages[page, half, j % kv.page_size, hk, d] = value
            else:
                kv.pages[page, half, hk, j % kv.page_size, d] = value
        spots.append(f"{where}[req {b}, key {j}, head {hk}, {d}]")
    case.injected = f"{value} at " + ", ".join(spots)


BASE_KINDS = ("ragged", "paged", "decode")


def draw_kind(seed: int, kinds: tuple):
    """The generator of ``seed`` and the case kind it draws first from ``kinds``; the kind's maker draws the rest
    from the same generator (so a seed gives the same batch whichever module dispatches it)."""
    rng = np.random.default_rng(seed)
    return rng, str(rng.choice(list(kinds)))


def make_case(variant: Variant, seed: int, head_dim: int = HEAD_DIM, kinds: tuple = BASE_KINDS) -> Case:
    """A random batch for ``variant`` from ``seed`` (float32 arrays; ``head_dim`` wide rows), of one of ``kinds``
    (the default draws as it always did: a seed gives the same batch). Base kinds only: fuzz_views.make_case takes
    the view kinds too."""
    rng, kind = draw_kind(seed, kinds)
    if kind not in BASE_KINDS:
        raise ValueError(f"{kind!r} is no base case kind {BASE_KINDS} (a view kind's case: fuzz_views.make_case)")
    return make_base_case(variant, kind, rng, head_dim)


def make_base_case(variant: Variant, kind: str, rng, head_dim: int = HEAD_DIM) -> Case:
    """A random batch of base ``kind`` for ``variant``, drawn from ``rng`` (make_case's draws after the kind)."""
    batch = int(rng.choice([0, 1, 2, 3, 4], p=[0.04, 0.24, 0.24, 0.24, 0.24]))
    if kind == "decode":
        qo_lens = [1] * batch
    else:
        qo_lens = [int(rng.choice([0, 1, 1, 2, 3, 5])) for _ in range(batch)]
    kv_lens = [0 if rng.random() < 0.12 else q + int(rng.integers(0, 10)) for q in qo_lens]
    if variant.param("mask_bits") is not None:  # a custom mask's rows are the request's own
        kv_lens = [max(k, q) for q, k in zip(qo_lens, kv_lens)]
    n_kv = int(rng.integers(1, 3))
    n_qo = n_kv * int(rng.integers(1, 4))
    layout = str(rng.choice(["NHD", "HND"]))
    page_size = int(rng.choice([1, 3, 4, 16]))
    prob = random_problem(rng, qo_lens, kv_lens, n_qo, n_kv, head_dim, page_size=page_size, layout=layout,
                          spare_pages=int(rng.integers(0, 4)))
    params = _params(variant, rng, qo_lens, kv_lens, n_qo, head_dim)
    kv = prob.ragged if kind == "ragged" else prob.paged
    case = Case(kind, prob.q, prob.qo_indptr, kv, [k.copy() for k in prob.keys], [v.copy() for v in prob.values],
                params, float(rng.choice([1 / np.sqrt(head_dim), 0.05, 1.0])))
    if rng.random() < 0.35:
        _inject(case, rng, qo_lens, kv_lens)
    return case


# ---- faults --------------------------------------------------------------------------------------------
FAULTS = ("none", "qo_indptr_decreasing", "qo_indptr_total", "indptr_int64", "kv_indptr_past_end",
          "page_id_out_of_range", "page_id_negative", "last_page_len_zero", "last_page_len_too_big",
          "last_page_len_count", "q_float64", "q_wrong_head_dim", "q_not_contiguous", "q_token_strided",
          "kv_heads_not_dividing",
          "pages_float16", "layout_unknown", "meta_device", "param_missing", "param_wrong_shape",
          "param_wrong_dtype", "out_wrong_shape", "lse_wrong_dtype", "kv_wrong_type",
          "pool_vllm", "pool_pair", "pool_gapped", "pool_padded_heads", "kv_fused_projection",
          "pool_pair_separate", "pool_pair_v_first", "pool_rows_strided", "scales_on_float_cache",
          "param_zero_divisor")

# The same batch in another memory layout every backend reads (runtime/kv_pool.py, checks.py): vLLM's cache
# [2, P, ...] transposed, FlashInfer's (k_pages, v_pages) pair of one allocation, NaN-filled gaps between pages
# or after each head's row, ragged keys and values (and q) as views of fused projections. A backend must
# accept them and match the reference.
LAYOUT_FORMS = ("pool_vllm", "pool_pair", "pool_gapped", "pool_padded_heads", "kv_fused_projection")
# pools the CUDA kernels cannot read in place (refused there by name; the CPU backend packs any pool and must then
# be right): rows with a stride, rows of one page overlapping the next page's (not drawn on the CPU: there the
# overlap rewrites the keys the reference holds)
STRIDED_POOLS = ("pool_rows_strided", "pool_overlapping")

# Faults attngen does not refuse yet (or not by name), with what is missing: run_case reports them as
# "gap:<fault>" (the long run counts them; a regression test holds each until the check exists). A view's valid
# calls that come out wrong on a known path are reported as "gap:<path>" by its oracle
# (fuzz_views._checked_view_call).
KNOWN_GAPS: dict[str, str] = {}

# faults that leave a meaningful call: attngen may also accept it (and must then be right)
BENIGN = {"none", "q_not_contiguous", "q_token_strided", "pool_rows_strided", *LAYOUT_FORMS}
# calls that must be accepted (and be right)
MUST_ACCEPT = {"none", *LAYOUT_FORMS}


@dataclass
class Call:
    q: object
    qo_indptr: object
    kv: object
    params: dict
    out: object = None
    lse: object = None
    refused: Exception | None = None  # an argument refused as it was made (a pair of pools: PagedKV's as_pool)
    scales: dict = field(default_factory=dict)  # k_scale / v_scale passed with the call


def apply_fault(case: Case, fault: str, rng) -> Call | None:
    """The call of ``case`` with ``fault``; None when the fault does not apply to the case."""
    call = Call(case.q, case.qo_indptr, case.kv, dict(case.params), scales=dict(case.scales or {}))
    hd = case.q.shape[2]
    kv = case.kv
    paged = isinstance(kv, PagedKV)
    nb = len(case.qo_indptr) - 1
    if fault == "none":
        return call
    if fault == "qo_indptr_decreasing":
        if case.kind == "decode" or nb < 2 or case.qo_indptr[-1] == 0:
            return None
        bad = case.qo_indptr.copy()
        bad[1] = bad[2] + 1  # rows of request 0 run past the start of request 1
        call.qo_indptr = bad
    elif fault == "qo_indptr_total":
        if case.kind == "decode" or nb == 0:
            return None
        call.qo_indptr = case.qo_indptr.copy()
        call.qo_indptr[-1] += 1
    elif fault == "indptr_int64":
        if case.kind == "decode":
            call.kv = replace(kv, indptr=kv.indptr.astype(np.int64))
        else:
            call.qo_indptr = case.qo_indptr.astype(np.int64)
    elif fault == "kv_indptr_past_end":
        if nb == 0:
            return None
        ind = kv.indptr.copy()
        ind[-1] = (kv.k.shape[0] if not paged else kv.indices.shape[0]) + 1
        call.kv = replace(kv, indptr=ind)
    elif fault in ("page_id_out_of_range", "page_id_negative"):
        if not paged or kv.indptr[-1] == 0:
            return None
        idx = kv.indices.copy()
        idx[int(rng.integers(int(kv.indptr[-1])))] = kv.pages.shape[0] + 2 if fault == "page_id_out_of_range" else -1
        call.kv = replace(kv, indices=idx)
    elif fault.startswith("last_page_len"):
        has = np.flatnonzero(np.diff(kv.indptr) > 0) if paged else []
        if not paged or len(has) == 0:
            return None
        last = kv.last_page_len.copy()
        if fault == "last_page_len_count":
            last = np.append(last, 1).astype(np.int32)
        else:
            last[int(has[0])] = 0 if fault == "last_page_len_zero" else kv.page_size + 1
        call.kv = replace(kv, last_page_len=last)
    elif fault == "q_float64":
        call.q = case.q.astype(np.float64)
    elif fault == "q_wrong_head_dim":
        call.q = np.zeros(case.q.shape[:2] + (hd * 2,), np.float32)
    elif fault == "q_not_contiguous":
        wide = np.zeros(case.q.shape[:2] + (hd * 2,), np.float32)
        wide[..., ::2] = case.q
        call.q = wide[..., ::2]
    elif fault == "q_token_strided":  # a view with a gap after each token's heads (a fused projection's q)
        n, h, d = case.q.shape
        wide = np.zeros((n, h * d + 4 * int(rng.integers(1, 4))), case.q.dtype)
        wide[:, :h * d] = case.q.reshape(n, h * d)
        call.q = wide[:, :h * d].reshape(n, h, d)
    elif fault == "kv_heads_not_dividing":
        n_kv = kv.num_kv_heads
        call.q = np.zeros((case.q.shape[0], n_kv * 2 + 1, hd), np.float32) if n_kv > 1 else None
        if call.q is None:
            return None
    elif fault == "pages_float16":
        call.kv = replace(kv, pages=kv.pages.astype(np.float16)) if paged else \
            replace(kv, k=kv.k.astype(np.float16))
    elif fault == "layout_unknown":
        if not paged:
            return None
        call.kv = replace(kv, layout="NDH")
    elif fault == "meta_device":
        import torch
        call.q = torch.empty(case.q.shape, device="meta")
    elif fault == "param_zero_divisor":  # a chunk of 0 positions divides by 0 (refused by name, no SIGFPE)
        if "fz_chunk" not in case.params:
            return None
        call.params["fz_chunk"] = 0
    elif fault.startswith("param_"):
        # a symbolic dim (mask_bits) takes any length: growing it is no fault
        tensors = [n for n, v in case.params.items() if isinstance(v, np.ndarray)
                   and (fault != "param_wrong_shape" or n != "mask_bits")]
        if not tensors:
            return None
        name = tensors[int(rng.integers(len(tensors)))]
        if fault == "param_missing":
            del call.params[name]
        elif fault == "param_wrong_shape":
            call.params[name] = np.zeros((case.params[name].size + 3,) + case.params[name].shape[1:],
                                         case.params[name].dtype)
        else:
            call.params[name] = case.params[name].astype(np.float64)
    elif fault == "out_wrong_shape":
        call.out = np.zeros((case.q.shape[0] + 1,) + case.q.shape[1:], np.float32)
    elif fault == "lse_wrong_dtype":
        call.lse = np.zeros(case.q.shape[:2], np.float16)
    elif fault == "kv_wrong_type":
        call.kv = (kv.k, kv.v) if not paged else kv.pages
    elif fault.startswith("pool_"):
        if not paged or (fault == "pool_pair_v_first" and kv.pages.size == 0):  # (no V to find before K)
            return None
        try:
            call.kv = replace(kv, pages=pool_in_form(kv.pages, fault))
        except ATTNGEN_ERRORS as e:
            call.refused = e
    elif fault == "scales_on_float_cache":  # scales belong to fp8 caches
        call.scales = {"k_scale": 1.0, "v_scale": 1.0}
    elif fault == "kv_fused_projection":
        if paged:
            return None
        (call.q,), (k, v) = fused_rows(case.q), fused_rows(kv.k, kv.v)  # q's and the keys' projections
        call.kv = replace(kv, k=k, v=v)
    return call


def pool_in_form(pages: np.ndarray, form: str):
    """The pool ``pages`` [P, 2, ...] (contiguous) copied into memory laid out as ``form`` (a pool_* fault or
    LAYOUT_FORMS entry): a view, or a (k_pages, v_pages) pair, holding the same values."""
    n = pages.shape[0]
    if form in ("pool_vllm", "pool_pair", "pool_pair_v_first"):
        cache = np.ascontiguousarray(pages.swapaxes(0, 1))  # [2, P, ...]
        return {"pool_vllm": cache.swapaxes(0, 1), "pool_pair": (cache[0], cache[1]),
                "pool_pair_v_first": (cache[1], cache[0])}[form]
    if form == "pool_pair_separate":
        return pages[:, 0].copy(), pages[:, 1].copy()
    if form == "pool_gapped":  # a third half of NaN after each page's keys and values
        buf = np.full((n, 3) + pages.shape[2:], np.nan, pages.dtype)
        buf[:, :2] = pages
        return buf[:, :2]
    if form == "pool_padded_heads":  # 16 NaN elements after every row (16 bytes at fp8, a multiple of 16 above)
        buf = np.full(pages.shape[:-1] + (pages.shape[-1] + 16,), np.nan, pages.dtype)
        buf[..., :pages.shape[-1]] = pages
        return buf[..., :pages.shape[-1]]
    if form == "pool_rows_strided":  # every other element of a row
        buf = np.full(pages.shape[:-1] + (2 * pages.shape[-1],), np.nan, pages.dtype)
        buf[..., ::2] = pages
        return buf[..., ::2]
    if form == "pool_overlapping":  # each page starts one row after the previous one
        row = pages.shape[-1] * pages.itemsize
        buf = np.zeros(pages.size + n * pages.shape[-1], pages.dtype)
        return np.lib.stride_tricks.as_strided(buf, pages.shape, (row,) + pages.strides[1:])
    raise ValueError(f"unknown pool form {form!r}")


def fused_rows(*xs):
    """Arrays [n, H_i, D] of one token count as views of one fused projection [n, sum(H_i) * D + 16] (16 NaN
    spare elements after each token: 16 bytes at fp8), holding the same values."""
    n, d = xs[0].shape[0], xs[0].shape[2]
    offsets = np.cumsum([0] + [x.shape[1] * d for x in xs])
    fused = np.full((n, int(offsets[-1]) + 16), np.nan, xs[0].dtype)
    for x, a, b in zip(xs, offsets[:-1], offsets[1:]):
        fused[:, a:b] = x.reshape(n, b - a)
    return tuple(fused[:, a:b].reshape(n, x.shape[1], d) for x, a, b in zip(xs, offsets[:-1], offsets[1:]))


# ---- the oracle ----------------------------------------------------------------------------------------
ARG_NAMES = ("q", "qo_indptr", "kv", "indptr", "indices", "last_page_len", "pages", "layout", "out", "lse",
             "param", "fz_", "mask_", "dtype", "device", "head", "k_scale", "v_scale")


HANG_SECONDS = 120  # a call (and its reference) taking longer is a hang: the process is ended with a traceback


def run_case(variant: Variant, att: CPUAttention, case: Case, fault: str, rng) -> str:
    """Outcome of one call of a base kind: "ok", "skip" (fault not applicable), "refused:<Error>" or "gap:<fault>"
    (a KNOWN_GAPS fault that was not refused); raises FuzzFailure. A call that hangs (in native code too, where
    no Python exception can reach it) ends the process after HANG_SECONDS with every thread's traceback.
    (fuzz_views.run_case takes the view kinds too.)"""
    if case.kind not in BASE_KINDS:
        raise ValueError(f"{case.kind!r} is no base case kind {BASE_KINDS} (a view kind's call: fuzz_views.run_case)")
    call = apply_fault(case, fault, rng)
    if call is None:
        return "skip"
    what = f"{variant.name} {case.kind} fault={fault} injected=({case.injected})"
    return guarded(fault, lambda: _checked_call(variant, att, case, call, fault, what))


def guarded(fault: str, check) -> str:
    """``check()``'s outcome, where a FuzzFailure of a KNOWN_GAPS fault comes out as "gap:<fault>"; a check that
    hangs ends the process after HANG_SECONDS with every thread's traceback."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        return check()
    except FuzzFailure:
        if fault in KNOWN_GAPS:
            return f"gap:{fault}"
        raise
    finally:
        faulthandler.cancel_dump_traceback_later()


def _checked_call(variant: Variant, att: CPUAttention, case: Case, call: Call, fault: str, what: str) -> str:
    try:
        if call.refused is not None:
            raise call.refused
        if case.kind == "decode":
            out, lse = att.decode(call.q, call.kv, sm_scale=case.sm_scale, params=call.params, out=call.out,
                                  lse=call.lse, **call.scales)
        else:
            out, lse = att.prefill(call.q, call.kv, call.qo_indptr, sm_scale=case.sm_scale, params=call.params,
                                   out=call.out, lse=call.lse, **call.scales)
    except ATTNGEN_ERRORS as e:
        msg = str(e)
        if fault in MUST_ACCEPT:
            raise FuzzFailure(f"{what}: a valid call was refused: {type(e).__name__}: {msg}") from e
        if not any(a in msg for a in ARG_NAMES):
            raise FuzzFailure(f"{what}: the refusal names no argument: {msg!r}") from e
        return f"refused:{type(e).__name__}"
    except Exception as e:  # anything else is a crash of attngen's own checks
        raise FuzzFailure(f"{what}: {type(e).__name__} instead of an attngen error: {e}") from e
    if fault not in BENIGN:
        raise FuzzFailure(f"{what}: the spoilt call was accepted")
    params = _with_defaults(variant, call.params)
    ref_o, ref_l = reference_attention(variant, case.q, case.keys, case.values,
                                       case.qo_indptr if case.kind != "decode" else np.arange(len(case.keys) + 1),
                                       case.sm_scale, params)
    _compare(out, lse, ref_o, ref_l, what)
    return "ok"


def _compare(out, lse, ref_o, ref_l, what: str) -> None:
    """The result against the float64 reference (``compare_nonfinite``'s rules); FuzzFailure where it differs."""
    scale = max(1.0, float(np.abs(ref_o[np.isfinite(ref_o)]).max()) if np.isfinite(ref_o).any() else 1.0)
    try:
        compare_nonfinite(np.asarray(out), np.asarray(lse), ref_o, ref_l, tol=3e-5 * scale * 8,
                          lse_tol=1e-4 * max(1.0, float(np.abs(ref_l[np.isfinite(ref_l)]).max(initial=0))),
                          what=what)
    except AssertionError as e:
        raise FuzzFailure(str(e)) from e


def _with_defaults(variant: Variant, params: dict) -> dict:
    """``params`` with the scalar parameters' declared defaults filled in (as the runtime does)."""
    full = dict(params)
    for p in variant.scalar_params:
        full.setdefault(p.name, p.default)
    return full


# ---- for the view kinds (tests/fuzz_views.py): paged caches, poisoning, a per-row reference ------------
def _pages_of(rng, lengths, page_size: int, n_kv: int, head_dim: int, layout: str, spare: int):
    """A cache of random pages holding one list of keys and values per entry of ``lengths``, written slot by slot
    over a random page permutation, ``spare`` pages unused. Returns (pages, page lists [int32 ids], last_page_len
    [int32, 0 for an empty list], keys, values [n, Hkv, D] per list)."""
    counts = [-(-n // page_size) for n in lengths]
    total = sum(counts) + spare
    ids = rng.permutation(total).astype(np.int32)
    pages = rng.standard_normal((total, 2, page_size, n_kv, head_dim)).astype(np.float32)
    lists, keys, values, at = [], [], [], 0
    for n, c in zip(lengths, counts):
        lists.append(ids[at:at + c])
        at += c
        k, v = rng.standard_normal((2, n, n_kv, head_dim)).astype(np.float32)
        j = np.arange(n)
        pages[lists[-1][j // page_size], 0, j % page_size] = k
        pages[lists[-1][j // page_size], 1, j % page_size] = v
        keys.append(k)
        values.append(v)
    last = np.array([n - (c - 1) * page_size if c else 0 for n, c in zip(lengths, counts)], np.int32)
    if layout == "HND":
        pages = np.ascontiguousarray(pages.transpose(0, 1, 3, 2, 4))
    return pages, lists, last, keys, values


def _write_slots(pages, layout: str, slots: np.ndarray, half: int, rows) -> None:
    """pages[slot] <- rows [N, Hkv, D] (``half`` 0 keys, 1 values; slot = page * page_size + place)."""
    ps = pages.shape[2] if layout == "NHD" else pages.shape[3]
    if layout == "NHD":
        pages[slots // ps, half, slots % ps] = rows
    else:
        pages[slots // ps, half, :, slots % ps] = rows


def _poison(rng, case: Case, rows: list) -> None:
    """Write NaN, +Inf or -Inf into an element of q, or into one or two elements of ``rows``, entries (name, keys or
    values array, copies) where ``copies(index)`` gives the [(array, index)] of the element's other copies (the
    pages, the appended rows), written the same."""
    value = float(rng.choice([np.nan, np.inf, -np.inf]))
    if rng.random() < 0.35 or not rows:
        if case.q.shape[0] == 0:
            return
        spot = tuple(int(rng.integers(n)) for n in case.q.shape)
        case.q[spot] = value
        case.injected = f"{value} at q{list(spot)}"
        return
    spots = []
    for _ in range(int(rng.integers(1, 3))):
        name, arr, copies = rows[int(rng.integers(len(rows)))]
        spot = tuple(int(rng.integers(n)) for n in arr.shape)
        arr[spot] = value
        for other, at in copies(spot):
            other[at] = value
        spots.append(f"{name}{list(spot)}")
    case.injected = f"{value} at " + ", ".join(spots)


def _slot_copies(pages, layout: str, page_list, half: int):
    """``copies`` (_poison) of a page list's keys (half 0) or values (1): element (j, h, d) in the pages."""
    ps = pages.shape[2] if layout == "NHD" else pages.shape[3]

    def at(spot):
        j, h, d = spot
        page, place = int(page_list[j // ps]), j % ps
        return [(pages, (page, half, place, h, d) if layout == "NHD" else (page, half, h, place, d))]
    return at


def _batch_lens(rng) -> list:
    """Query rows of a random batch's requests (none at times; empty and odd lengths)."""
    batch = int(rng.choice([0, 1, 2, 3, 4], p=[0.04, 0.24, 0.24, 0.24, 0.24]))
    return [int(rng.choice([0, 1, 1, 2, 3, 5])) for _ in range(batch)]


def stored_pages(k, v, page_size: int, layout: str, spare: int = 0) -> np.ndarray:
    """k, v [N, Hkv, D] in page order: [P, 2, page_size, Hkv, D] (NHD) or [P, 2, Hkv, page_size, D] (HND), the
    rows past N (and ``spare`` extra pages) NaN, which no kernel may read."""
    n, n_kv, d = k.shape
    n_pages = -(-n // page_size) + spare
    rows = np.full((2, n_pages * page_size, n_kv, d), np.nan, k.dtype)
    rows[0, :n], rows[1, :n] = k, v
    pages = rows.reshape(2, n_pages, page_size, n_kv, d).swapaxes(0, 1)
    return np.ascontiguousarray(pages if layout == "NHD" else pages.transpose(0, 1, 3, 2, 4))


def _rows_reference(variant: Variant, q, k, v, mask: np.ndarray, sm_scale: float, params: dict):
    """Float64 attention of each query row i over the keys ``mask[i]`` shows, in order (a request per row)."""
    m = int(q.shape[0])
    return reference_attention(variant, q, [k[mask[i]] for i in range(m)], [v[mask[i]] for i in range(m)],
                               np.arange(m + 1), sm_scale, params)
