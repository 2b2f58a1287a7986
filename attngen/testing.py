"""Random attention problems and reference comparisons shared by tests and examples.

A problem is a ragged batch (some requests may be empty) with its KV both as a
ragged pair and as a paged cache with randomly permuted pages plus unused ones.
Tolerances follow "k x (error of the same computation in the input dtype) + floor":
the same-dtype error is measured on the problem itself with PyTorch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attngen.ir import ScalarParam, TensorParam
from attngen.runtime.cpu import CPUAttention
from attngen.runtime.custom_mask import pack_custom_mask
from attngen.runtime.reference import gather_pages, reference_attention
from attngen.runtime.views import PagedKV, RaggedKV


@dataclass
class Problem:
    q: np.ndarray  # [total_q, Hq, D]
    qo_indptr: np.ndarray  # [B+1]
    ragged: RaggedKV
    paged: PagedKV
    keys: list  # per request [kv_len, Hkv, D] for the reference
    values: list
    qo_lens: list
    kv_lens: list


def random_problem(rng, qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim, *, page_size=4,
                   dtype="float32", layout="NHD", spare_pages=3) -> Problem:
    qo_lens, kv_lens = list(qo_lens), list(kv_lens)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo_indptr[-1]), num_qo_heads, head_dim)).astype(dtype)
    k = rng.standard_normal((int(kv_indptr[-1]), num_kv_heads, head_dim)).astype(dtype)
    v = rng.standard_normal((int(kv_indptr[-1]), num_kv_heads, head_dim)).astype(dtype)
    n_pages = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(n_pages) + spare_pages
    ids = rng.permutation(total)[: sum(n_pages)].astype(np.int32)
    pages = rng.standard_normal((total, 2, page_size, num_kv_heads, head_dim)).astype(dtype)
    page_indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, n_pages)], np.int32)
    # the ragged K/V into the requests' pages: row j of request b to slot j % page_size of its page j // page_size
    j = np.arange(int(kv_indptr[-1])) - np.repeat(kv_indptr[:-1], kv_lens)
    page = ids[np.repeat(page_indptr[:-1], kv_lens) + j // page_size]
    pages[page, 0, j % page_size] = k
    pages[page, 1, j % page_size] = v
    if layout == "HND":
        pages = np.ascontiguousarray(pages.transpose(0, 1, 3, 2, 4))
    paged = PagedKV(pages, page_indptr, ids, last, layout)
    keys, values = gather_pages(pages, page_indptr, ids, last, layout)
    return Problem(q, qo_indptr, RaggedKV(k, v, kv_indptr), paged, keys, values, qo_lens, kv_lens)


def paged_copy(k, v, kv_indptr, page_size: int, layout: str, rng):
    """A PagedKV holding ragged keys and values (torch k, v [rows, Hkv, D], kv_indptr [B+1] host) in pages of
    ``page_size`` rows, NHD or HND, every request's pages in one random order over the pool drawn from ``rng`` (None:
    in order; a request without keys holds none)."""
    import torch

    hkv, d = k.shape[1], k.shape[2]
    pages, counts, last = [], [], []
    for b in range(len(kv_indptr) - 1):
        n = int(kv_indptr[b + 1] - kv_indptr[b])
        m = -(-n // page_size)
        pad = torch.zeros(m * page_size, 2, hkv, d, dtype=k.dtype, device=k.device)
        pad[:n, 0], pad[:n, 1] = k[kv_indptr[b]:kv_indptr[b + 1]], v[kv_indptr[b]:kv_indptr[b + 1]]
        pages.append(pad.view(m, page_size, 2, hkv, d).permute(0, 2, 1, 3, 4))  # [m, 2, page, Hkv, D]
        counts.append(m)
        last.append(n - (m - 1) * page_size if m else 0)
    logical = torch.cat(pages)
    if layout == "HND":
        logical = logical.permute(0, 1, 3, 2, 4)
    perm = rng.permutation(len(logical)) if rng is not None else np.arange(len(logical))
    pool = torch.empty_like(logical.contiguous())
    pool[torch.as_tensor(perm, device=k.device)] = logical

    def ints(a):
        return torch.as_tensor(np.asarray(a, dtype=np.int32), device=k.device)

    return PagedKV(pool, ints(np.concatenate([[0], np.cumsum(counts)])), ints(perm), ints(last), layout)


def causal_slices(problem: Problem, rows: int) -> tuple[np.ndarray, Problem]:
    """A smaller reference problem for a mask that hides every key past a query's position (causal, causal
    windows): the first, a middle and the last ``rows`` query rows of each request longer than 3 x ``rows`` (shorter
    ones whole), each block a request of its own whose keys end at its last row's position, so that every row keeps
    its position (kv_len - qo_len + i) and sees the keys it saw. Returns (the picked rows' indices into
    problem.q, the problem of the blocks; its ragged / paged views are None: the reference reads keys / values)."""
    picked, blocks = [], []
    for b, (n, m) in enumerate(zip(problem.qo_lens, problem.kv_lens)):
        long = n > 3 * rows
        for s in (sorted({0, n // 2 - rows // 2, n - rows}) if long else [0]):
            e = s + rows if long else n
            blocks.append((b, s, e, m - n + e))
            picked.extend(range(problem.qo_indptr[b] + s, problem.qo_indptr[b] + e))
    picked = np.asarray(picked, dtype=np.int64)
    lens = [e - s for _, s, e, _ in blocks]
    return picked, Problem(problem.q[picked], np.concatenate([[0], np.cumsum(lens)]).astype(np.int32), None, None,
                           [problem.keys[b][:m] for b, _, _, m in blocks],
                           [problem.values[b][:m] for b, _, _, m in blocks], lens, [m for *_, m in blocks])


def random_params(variant, rng, problem: Problem) -> dict:
    """Plausible random values for a variant's extra parameters (built-ins and simple user ones)."""
    n_qo = problem.q.shape[1]
    out = {}
    for p in variant.params:
        if p.name in ("mask_bits", "mask_offset", "mask_stride"):
            if "mask_bits" not in out:
                masks = [rng.random((a, b)) < 0.6 for a, b in zip(problem.qo_lens, problem.kv_lens)]
                out.update(pack_custom_mask(masks, problem.kv_lens))
            continue
        if isinstance(p, TensorParam):
            shape = tuple(n_qo if d == "num_qo_heads" else len(problem.qo_lens) if d == "batch_size" else 8
                          for d in p.shape)
            out[p.name] = (rng.standard_normal(shape) * 0.5).astype(p.dtype) if "float" in p.dtype \
                else rng.integers(0, 4, shape).astype(p.dtype)
        elif isinstance(p, ScalarParam):
            if p.name == "window_left":
                out[p.name] = int(rng.integers(0, 6))
            elif p.default is not None:
                out[p.name] = p.default
            else:
                out[p.name] = 1 if "int" in p.dtype else float(rng.uniform(0.5, 2.0))
    return out


def same_dtype_error(problem: Problem, dtype: str, sm_scale: float) -> float:
    """Max error of plain softmax attention computed by PyTorch in ``dtype`` vs float64, on this batch."""
    return same_dtype_error_of(problem.q, problem.qo_indptr, problem.keys, problem.values, dtype, sm_scale)


def same_dtype_error_of(q, qo_indptr, keys, values, dtype: str, sm_scale: float) -> float:
    """``same_dtype_error`` of a batch given as arrays: q [total_q, Hq, D], qo_indptr [B+1], keys / values per
    request [kv_len, Hkv, D] (the values a kernel computes with: dequantised for an fp8 cache)."""
    import torch

    worst = 0.0
    for b, (k, v) in enumerate(zip(keys, values)):
        q0, q1 = qo_indptr[b], qo_indptr[b + 1]
        if q1 == q0 or len(k) == 0:
            continue
        n_kv = k.shape[1]
        # each KV head's query heads as one block of rows: [Hkv, group * qo_len, D] against [Hkv, kv_len, D]
        qs = torch.from_numpy(np.asarray(q[q0:q1], dtype=np.float64)).transpose(0, 1).reshape(n_kv, -1, q.shape[2])
        ks = torch.from_numpy(np.asarray(k, dtype=np.float64)).transpose(0, 1)
        vs = torch.from_numpy(np.asarray(v, dtype=np.float64)).transpose(0, 1)
        exact = torch.softmax(qs @ ks.transpose(1, 2) * sm_scale, -1) @ vs
        t = getattr(torch, dtype)
        low = (torch.softmax((qs.to(t) @ ks.to(t).transpose(1, 2)).float() * sm_scale, -1).to(t) @ vs.to(t))
        worst = max(worst, float((low.double() - exact).abs().max()))
    return worst


def rounding_error(ref_out: np.ndarray, dtype: str) -> float:
    """Max error of merely storing the exact answer in ``dtype`` (large for unnormalised sums)."""
    import torch

    exact = torch.from_numpy(np.asarray(ref_out, dtype=np.float64))
    return float((exact.to(getattr(torch, dtype)).double() - exact).abs().max()) if exact.numel() else 0.0


def tolerance(problem: Problem, ref_out: np.ndarray, dtype: str, sm_scale: float, k: float = 8.0) -> float:
    """k x (error of the same computation in ``dtype``) + floor; the same-dtype error is the larger of
    PyTorch's softmax attention in ``dtype`` on this batch and the rounding of the answer itself."""
    return _tolerance_from(same_dtype_error(problem, dtype, sm_scale), ref_out, dtype, k)


def _tolerance_from(same_dtype: float, ref_out: np.ndarray, dtype: str, k: float) -> float:
    """k x max(the same-dtype error, the answer's own rounding) + floor."""
    return k * max(same_dtype, rounding_error(ref_out, dtype)) + FLOORS[dtype]


def fp8_tolerance(q, qo_indptr, keys, values, k_scale, v_scale, ref_out, dtype: str, sm_scale: float,
                  k: float = 8.0) -> float:
    """``tolerance`` of a batch over an fp8 cache: q [total_q, Hq, D] (the query as the kernel gets it),
    qo_indptr [B+1], keys / values per request [kv_len, Hkv, D] as stored (fp8 values), k_scale / v_scale
    a float or [Hkv] per-head scales: the same-dtype error is PyTorch's on the dequantised values."""
    def dequant(rows, scale):
        return [np.asarray(r, dtype=np.float64) * np.asarray(scale, dtype=np.float64).reshape(-1, 1)
                for r in rows]

    err = same_dtype_error_of(np.asarray(q, dtype=np.float64), qo_indptr, dequant(keys, k_scale),
                              dequant(values, v_scale), dtype, sm_scale)
    return _tolerance_from(err, ref_out, dtype, k)


FLOORS = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def check_decode_plans(att, q, kv, head_dim: int, plans, ref_out, ref_lse, *, tol: float, lse_eps: float, what: str,
                       **call) -> None:
    """On the GPU: for each ``plan_decode`` keyword set of ``plans``, decode (``call``: params, scales) into
    NaN-filled outputs and compare with the reference; lse within max(2e-2, lse_eps x its largest finite |value|)."""
    import torch

    finite = np.abs(ref_lse[np.isfinite(ref_lse)])
    for plan_args in plans:
        plan = att.plan_decode(kv, q.shape[1], head_dim, **plan_args)
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device=q.device)
        att.decode(q, kv, plan=plan, out=out, lse=lse, **call)
        torch.cuda.synchronize()
        compare(out.float().cpu().numpy(), lse.cpu().numpy(), ref_out, ref_lse, tol=tol,
                lse_tol=max(2e-2, lse_eps * float(finite.max())), what=f"{what} {plan_args}")


def compare(out, lse, ref_out, ref_lse, *, tol: float, lse_tol: float, what: str) -> dict:
    """Assert closeness to the reference; empty rows must be exactly O = 0, lse = -inf (no NaN)."""
    out = np.asarray(out, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64)
    if np.isnan(out).any() or np.isnan(lse).any():
        raise AssertionError(f"{what}: NaN in the output ({int(np.isnan(out).sum())} values) or lse")
    err = float(np.abs(out - ref_out).max()) if out.size else 0.0
    empty = np.isneginf(ref_lse)
    if not np.array_equal(np.isneginf(lse), empty):
        raise AssertionError(f"{what}: rows with no visible key differ from the reference "
                             f"({int(np.isneginf(lse).sum())} vs {int(empty.sum())})")
    with np.errstate(invalid="ignore"):  # -inf - -inf on empty rows, masked out below
        lse_err = float(np.abs(np.where(empty, 0, lse - ref_lse)).max()) if lse.size else 0.0
    if err > tol or lse_err > lse_tol:
        raise AssertionError(f"{what}: max |O - ref| = {err:.3g} (tol {tol:.3g}), "
                             f"max |lse - ref| = {lse_err:.3g} (tol {lse_tol:.3g})")
    return {"out_err": err, "lse_err": lse_err}


def check_cpu_variant(att, variant, rng, *, qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim,
                      dtype="float32", layouts=("NHD", "HND"), page_size=4, k=8.0, make_params=None) -> dict:
    """Run prefill (ragged, paged per layout) and decode (paged per layout) on fresh random
    inputs with NaN-poisoned outputs, compare each with the float64 reference; return errors.
    ``make_params(variant, rng, problem)``: the variant's parameters for a batch (default random_params)."""
    random_params_ = make_params or random_params
    results = {}
    sm_scale = 1.0 / np.sqrt(head_dim)
    for layout in layouts:
        prob = random_problem(rng, qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim,
                              page_size=page_size, dtype=dtype, layout=layout)
        params = random_params_(variant, rng, prob)
        lse_tol = 1e-4 if dtype == "float32" else 2e-2
        ref_o, ref_l = reference_attention(variant, prob.q, prob.keys, prob.values, prob.qo_indptr,
                                           sm_scale, params)
        tol = tolerance(prob, ref_o, dtype, sm_scale, k)
        runs = {f"prefill_paged_{layout}": prob.paged}
        if layout == layouts[0]:
            runs["prefill_ragged"] = prob.ragged
        for name, kv in runs.items():
            out = np.full(prob.q.shape, np.nan, dtype=dtype)
            lse = np.full(prob.q.shape[:2], np.nan, dtype=np.float32)
            att.prefill(prob.q, kv, prob.qo_indptr, sm_scale=sm_scale, params=params, out=out, lse=lse)
            results[name] = compare(out, lse, ref_o, ref_l, tol=tol, lse_tol=lse_tol,
                                    what=f"{variant.name} {name} {dtype}")
        # decode: one query per request at the end of its sequence
        batch = len(kv_lens)
        dec = Problem(rng.standard_normal((batch, num_qo_heads, head_dim)).astype(dtype),
                      np.arange(batch + 1, dtype=np.int32), prob.ragged, prob.paged, prob.keys,
                      prob.values, [1] * batch, list(kv_lens))
        params = random_params_(variant, rng, dec)
        ref_o, ref_l = reference_attention(variant, dec.q, dec.keys, dec.values, dec.qo_indptr,
                                           sm_scale, params)
        out = np.full(dec.q.shape, np.nan, dtype=dtype)
        lse = np.full(dec.q.shape[:2], np.nan, dtype=np.float32)
        att.decode(dec.q, prob.paged, sm_scale=sm_scale, params=params, out=out, lse=lse)
        tol = tolerance(dec, ref_o, dtype, sm_scale, k)
        results[f"decode_paged_{layout}"] = compare(out, lse, ref_o, ref_l, tol=tol, lse_tol=lse_tol,
                                                    what=f"{variant.name} decode {layout} {dtype}")
    return results


def run_cpu_example(variant, *, head_dim=64, num_qo_heads=8, num_kv_heads=2, qo_lens=(5, 0, 9, 1),
                    kv_lens=(12, 3, 9, 20), seed=0, cache=None, make_params=None) -> dict:
    """Build ``variant`` for the CPU, check every kernel kind against the float64 reference, print a summary
    (``make_params``: see :func:`check_cpu_variant`)."""
    kwargs = {"cache": cache} if cache is not None else {}
    att = CPUAttention.build(variant, head_dims=(head_dim,), dtypes=("float32",), **kwargs)
    results = check_cpu_variant(att, variant, np.random.default_rng(seed), qo_lens=list(qo_lens),
                                kv_lens=list(kv_lens), num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                                head_dim=head_dim, make_params=make_params)
    print(f"{variant.name}: built {att.library.name}; mask {variant.analysis.mask.describe()}")
    for kind, r in results.items():
        print(f"  {kind:20s} max|O-ref| {r['out_err']:.2e}  max|lse-ref| {r['lse_err']:.2e}")
    return results
