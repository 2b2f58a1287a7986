"""Fuzzing the CUDA templates: the CPU fuzzer's random variants and batches (tests/fuzz_engine.py: hook
fragments composed into variants; ragged, paged and decode batches with empty and one-token requests, GQA,
both layouts, permuted pages with spare ones; NaN / Inf in q or k; malformed index arrays and arguments),
built for CUDA at head_dim 64 / float16 (``--fp8``: over fp8 caches, tests/fuzz_fp8.py), each call through every
template that serves it:

- decode on CUDA cores and on tensor cores, whole (one chunk), split into chunks, and the load-balanced
  plan (split-KV with the merge);
- prefill on the mma.sync template at both tile widths and, on compute capability 9.0, the Hopper one.

Each call must match the float64 reference computed on the float16-rounded inputs under the non-finite
rules (tests/nonfinite.py), or be refused with attngen's own error naming the argument. Anything else (a
crash, another exception, a wrong or accepted spoilt call) is a failure. A variant the CUDA build refuses
(a configuration it does not serve) is counted, not failed: refusing at build time is the contract.

NaN / Inf are not written into V: a tile template multiplies a masked key's value by weight 0 inside a
partly masked tile, which the rules leave open (docs/reliability.md).

    python benchmarks/fuzz_gpu.py --recipes 8 --cases 60 --out benchmarks/results
    compute-sanitizer --tool memcheck --error-exitcode 3 python benchmarks/fuzz_gpu.py --recipes 2 --cases 8
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz_engine import (ARG_NAMES, ATTNGEN_ERRORS, LAYOUT_FORMS, STRIDED_POOLS, Case, Recipe,  # noqa: E402
                               _with_defaults, all_recipes, apply_fault, make_case, make_variant)
from tests.fuzz_fp8 import FP8_FAULTS, FP8_KV_DTYPES, apply_fp8_fault, make_fp8_case  # noqa: E402
from tests.nonfinite import compare_nonfinite  # noqa: E402

HEAD_DIM = 64
# the CPU fuzzer's faults that stay faults once the arrays are on the GPU in float16 (its float16 pages, meta
# tensors and strided q are CPU-side probes)
GPU_FAULTS = ("qo_indptr_decreasing", "qo_indptr_total", "indptr_int64", "kv_indptr_past_end",
              "page_id_out_of_range", "page_id_negative", "last_page_len_zero", "last_page_len_too_big",
              "last_page_len_count", "q_float64", "q_wrong_head_dim", "kv_heads_not_dividing", "layout_unknown",
              "param_missing", "param_wrong_shape", "param_wrong_dtype", "out_wrong_shape", "lse_wrong_dtype",
              "kv_wrong_type", "pool_pair_separate", "pool_pair_v_first", *STRIDED_POOLS, "scales_on_float_cache",
              "param_zero_divisor")
# the CPU backend packs these pools (and must then be right); the CUDA entries refuse them by name
CUDA_ONLY_REFUSALS = STRIDED_POOLS
# valid calls in the layouts the kernels read in place (fuzz_engine.LAYOUT_FORMS), drawn beside a batch's plain
# call (not q_token_strided: its tokens lie 4 to 12 elements apart, which the kernels refuse at 16 bits)
GPU_FORMS = LAYOUT_FORMS
# fp8 faults the CUDA functions do not refuse where the scale is a tensor: they never read a device tensor's values
# (that would synchronise; fp8.device_kv_scales), so these are drawn for per-tensor (float) scales only
UNREAD_ON_DEVICE = ("scale_not_positive", "scale_not_finite")


def drawn_calls(case: Case, kv_dtype: str | None, seed: int, case_rng, fault_share: float,
                form_share: float) -> list[tuple[str, object, bool]]:
    """A batch's calls, as (fault, call, valid): the plain call, a spoilt one with probability ``fault_share``
    (an fp8 fault where ``kv_dtype`` is fp8, else a GPU fault) and one in a layout form with probability
    ``form_share``; draws from ``case_rng``, spoils with a generator seeded ``seed + 1``."""
    spoil = case_rng.random() < fault_share
    faults = ["none"] + ([str(case_rng.choice(FP8_FAULTS[1:] if kv_dtype else GPU_FAULTS))] if spoil else [])
    if case_rng.random() < form_share:
        faults.append(str(case_rng.choice(GPU_FORMS)))
    spoil_with = apply_fp8_fault if kv_dtype else apply_fault
    calls = []
    for fault in faults:
        if kv_dtype and fault in UNREAD_ON_DEVICE and np.ndim(case.scales["k_scale"]):  # (per-head scales)
            continue
        call = spoil_with(case, fault, np.random.default_rng(seed + 1))
        if call is not None:
            calls.append((fault, call, fault == "none" or fault in GPU_FORMS))
    return calls


def templates(kind: str, hopper: bool) -> list[tuple[str, dict]]:
    """(label, plan options) of every template path that serves a call of ``kind``."""
    if kind == "decode":
        return [("decode cuda-cores", dict(num_chunks=1, tensor_cores=False)),
                ("decode cuda-cores split", dict(num_chunks=3, tensor_cores=False)),
                ("decode tensor-cores", dict(num_chunks=1, tensor_cores=True)),
                ("decode tensor-cores split", dict(num_chunks=3, tensor_cores=True)),
                ("decode balanced", {})]
    paths = [("prefill mma.sync 64 rows", dict(template="mma_sync", wide_tiles=False)),
             ("prefill mma.sync 128 rows", dict(template="mma_sync", wide_tiles=True)),
             # the grid sized by a bound (the batch's total rows) as for CUDA graphs, not its longest request
             ("prefill mma.sync bounded", dict(template="mma_sync", bounded=True))]
    return paths + ([("prefill hopper", dict(template="hopper")),
                     ("prefill hopper bounded", dict(template="hopper", bounded=True))] if hopper else [])


def to_device(x, device: str, half: bool = True):
    """numpy arrays as torch tensors on ``device``, float32 data as float16 where ``half``; a view keeps its
    layout (its strides and offset into a copy of the array it views: a strided pool, a fused projection's
    rows)."""
    import torch

    from attngen.runtime import PagedKV, RaggedKV

    if isinstance(x, np.ndarray) and x.dtype.name in FP8_KV_DTYPES:  # ml_dtypes fp8: torch takes the bytes
        return to_device(x.view(np.uint8), device).view(getattr(torch, x.dtype.name))
    if isinstance(x, np.ndarray):
        owner = x
        while getattr(owner, "base", None) is not None:  # (through the objects as_strided leaves between)
            owner = owner.base
        if not isinstance(owner, np.ndarray) or not owner.flags["C_CONTIGUOUS"] \
                or owner.dtype.itemsize != x.itemsize or any(s % x.itemsize for s in x.strides):
            owner = x = np.ascontiguousarray(x)
        t = torch.from_numpy(owner.view(x.dtype))
        t = (t.half() if half and t.dtype == torch.float32 else t).to(device)
        if owner is x:
            return t
        offset = (x.__array_interface__["data"][0] - owner.__array_interface__["data"][0]) // x.itemsize
        return t.as_strided(x.shape, [s // x.itemsize for s in x.strides], offset)
    if isinstance(x, RaggedKV):
        return RaggedKV(*(to_device(a, device) for a in (x.k, x.v, x.indptr)))
    if isinstance(x, PagedKV):
        return PagedKV(*(to_device(a, device) for a in (x.pages, x.indptr, x.indices, x.last_page_len)), x.layout)
    if isinstance(x, tuple):
        return tuple(to_device(a, device) for a in x)
    return x


def rounded(case: Case) -> tuple:
    """q, keys and values as the GPU sees them (float16; an fp8 cache's keys and values exactly as it holds
    them), in float32 (float64) for the reference."""
    r = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    if case.scales is not None:
        return r(case.q), case.keys, case.values
    return r(case.q), [r(k) for k in case.keys], [r(v) for v in case.values]


def run_call(att, variant, case: Case, call, how: dict, device: str = "cuda") -> tuple[str, str]:
    """(outcome, detail): "ok", "refused:<Error>" or "fail" with the reason. ``device``: where the call's
    tensors go ("cpu" runs the oracle over a CPU module, tests/test_gpu_fuzz.py)."""
    import torch

    from attngen.runtime import reference_attention

    what = f"{variant.name} {case.kind} {how} injected=({case.injected})"
    try:
        if call.refused is not None:  # refused as the call was made (a pair of pools)
            raise call.refused
        q, kv = to_device(call.q, device), to_device(call.kv, device)
        params = {k: to_device(v, device, half=False) for k, v in call.params.items()}
        scales = {k: to_device(v, device, half=False) for k, v in call.scales.items()}
        out = to_device(call.out, device) if call.out is not None else None
        lse = to_device(call.lse, device, half=False) if call.lse is not None else None
        if out is not None:
            out.fill_(float("nan"))
        if case.kind == "decode":
            plan = att.plan_decode(kv, int(q.shape[1]), HEAD_DIM, **how)
            o, l = att.decode(q, kv, plan=plan, sm_scale=case.sm_scale, params=params, out=out, lse=lse, **scales)
        else:
            qo = to_device(call.qo_indptr, device)
            how = dict(how)
            if how.pop("bounded", False):  # a bound of the call's total query rows (its own longest at least)
                rows = np.diff(np.asarray(call.qo_indptr, np.int64))
                how["max_qo_len"] = int(max(rows.sum(), rows.max(initial=0))) if rows.size else 0
            plan = att.plan_prefill(qo, kv, HEAD_DIM, **how)
            o, l = att.prefill(q, kv, qo, plan=plan, sm_scale=case.sm_scale, params=params, out=out, lse=lse,
                               **scales)
        if device == "cuda":
            torch.cuda.synchronize()
    except ATTNGEN_ERRORS as e:
        msg = str(e)
        if not any(a in msg for a in ARG_NAMES):
            return "fail", f"{what}: the refusal names no argument: {msg!r}"
        return f"refused:{type(e).__name__}", msg
    except Exception as e:  # a crash, a CUDA error, an FFI error: never acceptable
        return "fail", f"{what}: {type(e).__name__}: {e}"
    q16, keys, values = rounded(case)
    qo_ref = case.qo_indptr if case.kind != "decode" else np.arange(len(case.keys) + 1)
    ref_o, ref_l = reference_attention(variant, q16, keys, values, qo_ref, case.sm_scale,
                                       _with_defaults(variant, call.params))
    fin = np.isfinite(ref_o)
    scale = max(1.0, float(np.abs(ref_o[fin]).max()) if fin.any() else 1.0)
    lfin = np.isfinite(ref_l)
    try:
        compare_nonfinite(o.float().cpu().numpy(), l.float().cpu().numpy(), ref_o, ref_l, tol=1e-2 * scale,
                          lse_tol=1e-2 * max(1.0, float(np.abs(ref_l[lfin]).max(initial=0))), what=what)
    except AssertionError as e:
        return "fail", str(e)
    return "ok", ""


class PlanlessCPU:
    """The CPU backend behind the CUDA module's plan / call methods (plans ignored): the harness's own check."""

    def __init__(self, att):
        self.att = att

    def plan_decode(self, kv, num_qo_heads, head_dim, **how):
        return None

    def plan_prefill(self, qo_indptr, kv, head_dim, **how):
        return None

    def decode(self, q, kv, plan=None, **kw):
        return self.att.decode(q, kv, **kw)

    def prefill(self, q, kv, qo_indptr, plan=None, **kw):
        return self.att.prefill(q, kv, qo_indptr, **kw)


def shard(seed: int, recipes: int, part: int = 0, parts: int = 1) -> list[tuple[int, Recipe]]:
    """(index, recipe) of the ``recipes`` recipes drawn with ``seed`` whose index is ``part`` modulo ``parts``:
    the shards of one draw are disjoint and together the whole draw."""
    space = list(all_recipes())
    picks = np.random.default_rng(seed).choice(len(space), size=min(recipes, len(space)), replace=False)
    return [(i, space[k]) for i, k in enumerate(picks) if i % parts == part]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", type=int, default=8, help="random recipes (variants) to build for CUDA")
    ap.add_argument("--cases", type=int, default=60, help="random batches per recipe")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--fault-share", type=float, default=0.4, help="share of batches also called spoilt")
    ap.add_argument("--form-share", type=float, default=0.3,
                    help="share of batches also called in another valid layout (GPU_FORMS: strided pools, pairs, "
                         "fused projections)")
    ap.add_argument("--out", default=None, help="write fuzz_gpu_<date>.json here")
    ap.add_argument("--fp8", action="store_true",
                    help="fp8 caches (tests/fuzz_fp8.py: e4m3 and e5m2 by turns of the recipes, random per-tensor or "
                         "per-head scales) with FP8_FAULTS for spoilt calls")
    ap.add_argument("--seconds", type=float, default=None,
                    help="start no new recipe after this many seconds (the figures cover the recipes run)")
    ap.add_argument("--part", default="0/1", metavar="I/N",
                    help="run only the drawn recipes whose index is I modulo N (parallel shards of one draw)")
    ap.add_argument("--cpu", action="store_true",
                    help="run the harness itself on the CPU backend (one path per call; the pools the CPU backend "
                         "packs, CUDA_ONLY_REFUSALS, count as valid): a check of the harness without a GPU")
    args = ap.parse_args(argv)
    try:
        part, parts = (int(x) for x in args.part.split("/"))
    except ValueError:
        ap.error(f"--part {args.part}: give I/N, two whole numbers")
    if not 0 <= part < parts:
        ap.error(f"--part {args.part}: I must lie in [0, N)")

    import torch

    from attngen.runtime import CPUAttention, CUDAAttention

    device = "cpu" if args.cpu else "cuda"
    hopper = not args.cpu and torch.cuda.get_device_capability() == (9, 0)
    counts, by_path, failures, build_refused = collections.Counter(), collections.Counter(), [], []
    start, ran = time.monotonic(), []
    for index, recipe in shard(args.seed, args.recipes, part, parts):
        if args.seconds is not None and time.monotonic() - start > args.seconds:
            break
        ran.append(recipe.name)
        variant = make_variant(recipe)
        kv_dtype = FP8_KV_DTYPES[index % 2] if args.fp8 else None  # (fp8: the formats in turn)
        try:
            build = dict(head_dims=(HEAD_DIM,), dtypes=("float16",), layouts=("NHD", "HND"),
                         kv_dtypes=(kv_dtype,) if kv_dtype else ())
            att = PlanlessCPU(CPUAttention.build(variant, **build)) if args.cpu else \
                CUDAAttention.build(variant, **build)
        except ATTNGEN_ERRORS as e:
            build_refused.append(f"{variant.name}: {e}")
            continue
        case_rng = np.random.default_rng([args.seed, index])  # the recipe's own stream: the same in every shard
        for _ in range(args.cases):
            seed = int(case_rng.integers(2**32))
            case = make_fp8_case(variant, seed, kv_dtype, HEAD_DIM) if kv_dtype else \
                make_case(variant, seed, head_dim=HEAD_DIM)
            if "v[" in case.injected:  # see the module's docstring
                counts["skipped: non-finite V"] += 1
                continue
            for fault, call, valid in drawn_calls(case, kv_dtype, seed, case_rng, args.fault_share,
                                                  args.form_share):
                valid = valid or (args.cpu and fault in CUDA_ONLY_REFUSALS)
                for label, how in [("cpu", {})] if args.cpu else templates(case.kind, hopper):
                    outcome, detail = run_call(att, variant, case, call, how, device)
                    if outcome == "ok" and not valid:
                        outcome, detail = "fail", f"{variant.name} {label}: the spoilt call ({fault}) was accepted"
                    if outcome.startswith("refused") and valid:
                        outcome, detail = "fail", (f"{variant.name} {label}: a valid call ({fault}) was refused: "
                                                   f"{detail}")
                    counts[outcome] += 1
                    by_path[f"{label}: {outcome}"] += 1
                    if outcome == "fail":
                        failures.append({"recipe": recipe.name, "seed": seed, "fault": fault, "path": label,
                                         "detail": detail[:2000]})
        print(f"{time.monotonic() - start:7.1f} s  {recipe.name}: {dict(counts)}", flush=True)
    res = {"gpu": "cpu" if args.cpu else torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "seed": args.seed,
           "recipes": ran, "seconds": round(time.monotonic() - start, 1), "build_refused": build_refused, "calls": sum(
               v for k, v in counts.items() if not k.startswith("skipped")), "outcomes": dict(counts),
           "by_path": dict(sorted(by_path.items())), "failures": failures[:50], "failure_count": len(failures)}
    print(json.dumps({k: res[k] for k in ("calls", "outcomes", "failure_count", "build_refused")}, indent=1))
    for f in failures[:10]:
        print("FAIL", f["path"], f["detail"][:400])
    if args.out:
        path = Path(args.out) / f"fuzz_gpu_{res['date']}.json"
        path.write_text(json.dumps(res, indent=1))
        print("wrote", path)
    print("fuzz_gpu done")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
