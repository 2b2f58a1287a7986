"""The fuzzer over fp8 KV caches: float8_e4m3fn / float8_e5m2 with one scale or one per KV head.

``make_fp8_case`` takes a base batch of ``fuzz_engine.make_case`` (ragged, paged or decode, NaN / Inf injected
at times) and stores its keys and values in fp8 with ``runtime.fp8.quantize_kv`` at random scales (some below
the data's range, so that values saturate); the case's keys and values for the reference become what the cache
holds, dequantised in float64 (NaN stays NaN, an Inf saturates to the format's largest value). The call passes
the scales; ``FP8_FAULTS`` spoil them (missing, wrong length, dtype, sign, NaN), the cache (its raw bytes, an
unquantised cache given to fp8 functions, a pair of two allocations) and the query (fp8 queries), or lay the cache
out as the kernels read it in place (fuzz_engine.LAYOUT_FORMS). The oracle is fuzz_engine's: the result
matches the float64 reference, or the call is refused with attngen's error naming the argument.
``run_fp8_view_case`` stores the pool of a cascade or block-sparse case of tests/fuzz_views.py in fp8 and checks
the view against the same view over the values the pool holds.

Used by tests/test_fuzz_cpu.py (bounded), benchmarks/fuzz_long.py --fp8 [--views] and benchmarks/fuzz_gpu.py --fp8.
"""
from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np

from attngen import Variant
from attngen.runtime import CPUAttention, PagedKV
from attngen.runtime.fp8 import FP8_FORMATS, dequantize_kv, quantize_kv
from attngen.runtime.reference import gather_pages

from .fuzz_engine import (ATTNGEN_ERRORS, HEAD_DIM, LAYOUT_FORMS, Call, Case, FuzzFailure, _checked_call,
                          all_recipes, apply_fault, guarded, make_case, make_variant)
from .fuzz_views import _VIEW_RUNNERS, ViewCall, apply_view_fault

FP8_KV_DTYPES = ("float8_e4m3fn", "float8_e5m2")
FP8_FAULTS = ("none", "k_scale_missing", "v_scale_missing", "scale_wrong_length", "scale_not_positive",
              "scale_not_finite", "scale_float64", "pages_raw_bytes", "kv_unquantised", "q_fp8",
              # the layouts every backend reads (fuzz_engine.LAYOUT_FORMS) and a pair it refuses, over fp8 pools
              *LAYOUT_FORMS, "pool_pair_separate")

_BUILT: dict = {}


def built_fp8(recipe, kv_dtype: str, cache=None) -> tuple[Variant, CPUAttention]:
    """The recipe's variant and its CPU module over ``kv_dtype`` caches (float32 queries), built once per process."""
    key = (recipe, kv_dtype)
    if key not in _BUILT:
        variant = make_variant(recipe)
        kwargs = {"cache": cache} if cache is not None else {}
        _BUILT[key] = (variant, CPUAttention.build(variant, head_dims=(HEAD_DIM,), dtypes=("float32",),
                                                   kv_dtypes=(kv_dtype,), **kwargs))
    return _BUILT[key]


def make_fp8_case(variant: Variant, seed: int, kv_dtype: str, head_dim: int = HEAD_DIM) -> Case:
    """The batch ``make_case(variant, seed)`` draws, its cache stored as ``kv_dtype`` (the base draw is kept: the
    fp8 choices come from a generator of their own)."""
    case = make_case(variant, seed, head_dim=head_dim)
    kv = case.kv
    scale_of = scale_drawer(np.random.default_rng([seed, 8]), kv.num_kv_heads, kv_dtype)
    if isinstance(kv, PagedKV):
        stored, held, scales = quantised_pool(kv.pages, kv.layout, kv_dtype, scale_of)
        case.kv = replace(kv, pages=stored)
        case.keys, case.values = gather_pages(held, kv.indptr, kv.indices, kv.last_page_len, kv.layout)
    else:
        scales = [scale_of(kv.k), scale_of(kv.v)]
        k, v = (quantize_kv(x, kv_dtype, s) for x, s in ((kv.k, scales[0]), (kv.v, scales[1])))
        case.kv = replace(kv, k=k, v=v)
        cuts = kv.indptr[1:-1]
        case.keys = np.split(dequantize_kv(k, scales[0]), cuts)
        case.values = np.split(dequantize_kv(v, scales[1]), cuts)
    case.scales = {"k_scale": scales[0], "v_scale": scales[1]}
    return case


def scale_drawer(rng, n_kv: int, kv_dtype: str):
    """``scale_of(rows [..., Hkv, D])``: a random scale for rows of ``n_kv`` heads, one for all (a float, 40% of
    drawers) or one per head (float32 [Hkv]), each the largest finite magnitude over the format's largest value
    times a factor in [0.5, 2) (below 1: the largest values saturate)."""
    per_tensor = rng.random() < 0.4

    def scale_of(rows):
        mag = np.where(np.isfinite(rows), np.abs(rows), 0.0).reshape(-1, n_kv, rows.shape[-1])
        amax = mag.max(axis=(0, 2)) if mag.shape[0] else np.zeros(n_kv)
        s = np.where(amax > 0, amax / FP8_FORMATS[kv_dtype].max_finite, 1.0) * rng.uniform(0.5, 2.0, n_kv)
        return float(s.max()) if per_tensor else s.astype(np.float32)
    return scale_of


def quantised_pool(pages, layout: str, kv_dtype: str, scale_of):
    """(the pool ``pages`` [P, 2, ...] stored as ``kv_dtype``, the float64 values it holds, [k_scale, v_scale]);
    ``scale_of(rows [..., Hkv, D])`` draws a half's scale."""
    nhd = pages if layout == "NHD" else pages.transpose(0, 1, 3, 2, 4)  # [P, 2, S, Hkv, D]
    scales = [scale_of(nhd[:, h]) for h in (0, 1)]
    halves = [quantize_kv(np.ascontiguousarray(nhd[:, h]), kv_dtype, scales[h]) for h in (0, 1)]
    stored = np.stack(halves, axis=1)
    held = np.stack([dequantize_kv(halves[h], scales[h]) for h in (0, 1)], axis=1)
    if layout == "HND":
        stored, held = (np.ascontiguousarray(x.transpose(0, 1, 3, 2, 4)) for x in (stored, held))
    return stored, held, scales


def apply_fp8_fault(case: Case, fault: str, rng) -> Call | None:
    """The call of an fp8 ``case`` with ``fault`` (one of FP8_FAULTS); None where it does not apply."""
    if fault.startswith("pool_") or fault in LAYOUT_FORMS:
        return apply_fault(case, fault, rng)
    call = Call(case.q, case.qo_indptr, case.kv, dict(case.params), scales=dict(case.scales))
    kv = case.kv
    paged = isinstance(kv, PagedKV)
    n_kv = kv.num_kv_heads
    name = str(rng.choice(["k_scale", "v_scale"]))
    if fault in ("k_scale_missing", "v_scale_missing"):
        del call.scales[fault[:7]]
    elif fault == "scale_wrong_length":
        call.scales[name] = np.ones(n_kv + 1, np.float32)
    elif fault in ("scale_not_positive", "scale_not_finite"):
        bad = float(rng.choice([0.0, -1.0] if fault == "scale_not_positive" else [np.nan, np.inf]))
        if np.ndim(call.scales[name]):  # one head's scale
            per_head = np.array(call.scales[name], np.float32)
            per_head[int(rng.integers(n_kv))] = bad
            call.scales[name] = per_head
        else:
            call.scales[name] = bad
    elif fault == "scale_float64":
        call.scales[name] = np.full(n_kv, 0.5, np.float64)
    elif fault == "pages_raw_bytes":  # the fp8 bytes as uint8 (a cache allocated as bytes, not viewed as fp8)
        call.kv = replace(kv, pages=kv.pages.view(np.uint8)) if paged else replace(kv, k=kv.k.view(np.uint8))
    elif fault == "kv_unquantised":  # a float32 cache handed to the fp8 functions
        call.kv = replace(kv, pages=kv.pages.astype(np.float32)) if paged else \
            replace(kv, k=kv.k.astype(np.float32), v=kv.v.astype(np.float32))
    elif fault == "q_fp8":
        call.q = case.q.astype(ml_dtypes.float8_e4m3fn)
    elif fault != "none":
        raise ValueError(f"unknown fp8 fault {fault!r}")
    return call


def run_fp8_case(variant: Variant, att, case: Case, fault: str, rng) -> str:
    """fuzz_engine.run_case for an fp8 case: "ok", "skip" or "refused:<Error>"; raises FuzzFailure."""
    call = apply_fp8_fault(case, fault, rng)
    if call is None:
        return "skip"
    what = f"{variant.name} {case.kind} fp8 scales={_scales_summary(case.scales)} fault={fault} " \
           f"injected=({case.injected})"
    return guarded(fault, lambda: _checked_call(variant, att, case, call, fault, what))


def _scales_summary(scales: dict) -> str:
    return "per-head" if np.ndim(scales["k_scale"]) else "per-tensor"


# ---- views over fp8 pools -------------------------------------------------------------------------------------
FP8_VIEW_KINDS = ("cascade", "bsr")


def view_recipes() -> list:
    """The recipes cascades and block-sparse views serve at all: no positional hook but a causal mask alone
    (fuzz_views._view_refuses; a headwise view still refuses head-reading hooks, which its cases skip)."""
    return [r for r in all_recipes() if r.mask in ((), ("causal",)) and "alibi" not in r.logits]


def run_fp8_view_case(variant: Variant, att32, att8, case: Case, kv_dtype: str, seed: int) -> str:
    """A cascade or block-sparse case of tests/fuzz_views.py (its valid call) over its pool stored as ``kv_dtype``
    at random scales: the view run by ``att8`` with the scales equals the same view run by ``att32`` over the
    float32 pool of the values held (NaN where it has NaN, else within float32 rounding); "skip" where the view
    refuses the variant. The float32 view is the one the views' fuzzer holds to the reference."""
    call = apply_view_fault(variant, case, "none", np.random.default_rng(seed + 1))
    if call is None or call.names is not None:
        return "skip"
    a = call.args
    n_kv = int(a["pages"].shape[3] if a["layout"] == "NHD" else a["pages"].shape[2])
    stored, held, scales = quantised_pool(a["pages"], a["layout"], kv_dtype,
                                          scale_drawer(np.random.default_rng([seed, 8]), n_kv, kv_dtype))
    what = (f"{variant.name} {case.kind} over {kv_dtype} ({_scales_summary(dict(k_scale=scales[0]))} scales) "
            f"injected=({case.injected}) {call.summary()}")

    def check() -> str:
        run = _VIEW_RUNNERS[case.kind]
        want_o, want_l = run(variant, att32, case, ViewCall(case.kind, dict(a, pages=held.astype(np.float32))))
        kv_scales = {"k_scale": scales[0], "v_scale": scales[1]}
        try:
            out, lse = run(variant, att8, case, ViewCall(case.kind, dict(a, pages=stored, kv_scales=kv_scales)))
        except ATTNGEN_ERRORS as e:
            raise FuzzFailure(f"{what}: the fp8 view was refused: {type(e).__name__}: {e}") from e
        for name, got, want in (("O", out, want_o), ("lse", lse, want_l)):
            got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
            same_nan = np.array_equal(np.isnan(got), np.isnan(want))
            fin = np.isfinite(want)
            tol = 1e-4 * max(1.0, float(np.abs(want[fin]).max(initial=0)))
            if not same_nan or not np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)]) \
                    or (fin.any() and float(np.abs(got[fin] - want[fin]).max()) > tol):
                raise FuzzFailure(f"{what}: {name} over the fp8 pool differs from the view over its values")
        return "ok"
    return guarded("none", check)
