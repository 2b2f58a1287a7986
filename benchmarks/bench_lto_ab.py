"""Whole-program vs link-time builds of one variant (BuildConfig.link "whole" / "lto"): build seconds, and on
a GPU the outputs (bit-identical expected: the hooks are inlined into the same template code) and the
kernels' times, through the same runtime.

``--compile-only`` (any machine with nvcc and libnvJitLink) times the builds alone: the whole-program
build, the first linked build (template objects and host glue compiled, or taken from the cache), a
one-constant edit of a hook body (only the hooks compiled and linked), and a new variant of the same hook
signature. ``--kv-dtype`` builds both over an fp8 K/V cache (the calls pass k_scale / v_scale).

    python benchmarks/bench_lto_ab.py --variant logits_softcap --kernels decode,prefill
    python benchmarks/bench_lto_ab.py --kv-dtype float8_e4m3fn --kernels decode,prefill
    python benchmarks/bench_lto_ab.py --compile-only --arch sm_80 --kernels decode
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attngen.build import build  # noqa: E402
from attngen.schedules import BuildConfig  # noqa: E402


def _config(link: str, kernels, head_dim: int, dtype: str, arch: str, kv_dtype: str | None = None) -> BuildConfig:
    """``kv_dtype``: the cache's K/V dtype (None: the query's; an fp8 format: the fp8 entries)."""
    return BuildConfig(target="cuda", head_dims=(head_dim,), dtypes=(dtype,), archs=(arch,), kernels=tuple(kernels),
                       kv_dtypes=(kv_dtype or dtype,), link=link)


def _timed_build(variant, cfg, cache):
    t = time.perf_counter()
    res = build(variant, cfg, cache=cache)
    return res, time.perf_counter() - t


def scaled_softcap(scale: float, name: str = "softcap_scaled"):
    """A soft-cap with one constant in its hook body (the edit the compile-only mode times)."""
    from tvm.script import tirx as T

    from attngen.ir import ScalarParam, Variant

    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32, cap: T.float32) -> T.float32:
        return cap * T.tanh(s / cap) * T.float32(scale)

    return Variant(name, logits_transform=f, params=[ScalarParam("cap", "float32", 30.0)])


def softcap_two_params():
    """The soft-cap's hook signature with another parameter list (a new variant whose exports compile)."""
    from tvm.script import tirx as T

    from attngen.ir import ScalarParam, Variant

    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32, cap: T.float32, scale: T.float32) -> T.float32:
        return cap * T.tanh(s / cap) * scale

    return Variant("softcap_two", logits_transform=f,
                   params=[ScalarParam("cap", "float32", 30.0), ScalarParam("scale", "float32", 1.0)])


def compile_times(kernels, head_dim: int, dtype: str, arch: str, cache=None, kv_dtype: str | None = None) -> dict:
    """Seconds of, in a fresh build cache unless ``cache`` is given: the whole-program build, the first
    linked build (template objects, launch object and exports compiled), a one-constant edit of the hook
    (only the hooks compiled, then linked), a new variant of the same signature and parameter list, and
    one with another parameter list (its exports compiled too)."""
    import tempfile

    from attngen.codegen import lto
    from attngen.codegen.cache import BuildCache

    cache = cache or BuildCache(tempfile.mkdtemp(prefix="attngen-lto-bench-"))
    rows, results = {}, {}
    _, rows["whole"] = _timed_build(scaled_softcap(1.0), _config("whole", kernels, head_dim, dtype, arch, kv_dtype),
                                    cache)
    cfg = _config("lto", kernels, head_dim, dtype, arch, kv_dtype)
    for label, variant in [("lto_first", scaled_softcap(1.0)), ("lto_hook_edit", scaled_softcap(2.0)),
                           ("lto_new_variant", scaled_softcap(3.0, name="softcap_other")),
                           ("lto_new_params", softcap_two_params())]:
        results[label], rows[label] = _timed_build(variant, cfg, cache)
    return {"kernels": list(kernels), "arch": arch, "head_dim": head_dim, "dtype": dtype, "kv_dtype": kv_dtype or dtype,
            "seconds": {k: round(v, 2) for k, v in rows.items()},
            "steps": {k: r.manifest["lto_seconds"] for k, r in results.items()},
            "reused": {k: r.manifest["lto_reused"] for k, r in results.items()}, "stats": dict(lto.stats)}


def _to(x, dtype=None):
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x))
    return (t.to(getattr(torch, dtype)) if dtype else t).cuda()


def _device_params(variant, rng, problem) -> dict:
    """random_params' values for ``problem`` (a Problem, or anything with its q, qo_lens and kv_lens), arrays on
    the device."""
    from attngen.testing import random_params

    return {k: (_to(v) if isinstance(v, np.ndarray) else v) for k, v in random_params(variant, rng, problem).items()}


def _runs_hopper(att) -> bool:
    """Whether the library has sm_90a and this device is of compute capability 9.0 (the Hopper template runs)."""
    import torch

    return "sm_90a" in att.manifest["config"]["archs"] and torch.cuda.get_device_capability()[0] == 9


def _calls(att, variant, kernels, head_dim: int, dtype: str, seed: int = 0, kv_dtype: str | None = None,
           large: bool = False):
    """name -> a function that plans and returns a function running one call of the module on fixed random
    inputs (returning its outputs).
    ``kv_dtype``: an fp8 format stores K/V rounded to it, read with fixed k_scale / v_scale. ``large``: also
    the shapes of :func:`_large_calls`."""
    import torch

    from attngen.runtime import PagedKV, RaggedKV
    from attngen.testing import random_problem

    rng = np.random.default_rng(seed)
    kv_dtype = kv_dtype or dtype
    scales = {} if kv_dtype == dtype else {"k_scale": 0.5, "v_scale": 2.0}
    calls = {}
    if "decode" in kernels:
        kv_lens = [37, 0, 300, 1, 129, 4000, 2048, 700]
        prob = random_problem(rng, [1] * len(kv_lens), kv_lens, 32, 8, head_dim, page_size=16)
        kv = PagedKV(_to(prob.paged.pages, kv_dtype), _to(prob.paged.indptr), _to(prob.paged.indices),
                     _to(prob.paged.last_page_len), "NHD")
        q = _to(prob.q, dtype)
        params = _device_params(variant, rng, prob)
        for tc in (False, True):
            def make(tc=tc, kv=kv, q=q, params=params):
                plan = att.plan_decode(kv, q.shape[1], head_dim, tensor_cores=tc)
                out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
                return lambda: att.decode(q, kv, plan=plan, params=params, out=out, lse=lse, **scales)

            calls[f"decode_tc={tc}"] = make
    if "prefill" in kernels:
        qo_lens, kv_lens = [1, 17, 300, 1024], [1, 40, 300, 3000]
        prob = random_problem(rng, qo_lens, kv_lens, 32, 8, head_dim, page_size=16)
        paged = PagedKV(_to(prob.paged.pages, kv_dtype), _to(prob.paged.indptr), _to(prob.paged.indices),
                        _to(prob.paged.last_page_len), "NHD")
        ragged = RaggedKV(_to(prob.ragged.k, kv_dtype), _to(prob.ragged.v, kv_dtype), _to(prob.ragged.indptr))
        q, qo_indptr = _to(prob.q, dtype), _to(prob.qo_indptr)
        params = _device_params(variant, rng, prob)
        # both templates (the Hopper one where the library has sm_90a and the device is of compute capability 9.0)
        hopper = _runs_hopper(att)
        runs = [("mma_sync", False, paged), ("mma_sync", True, paged), ("mma_sync", False, ragged)]
        runs += [("hopper", None, paged), ("hopper", None, ragged)] if hopper else []
        for template, wide, kv in runs:
            def make(template=template, wide=wide, kv=kv, q=q, qo_indptr=qo_indptr, params=params):
                plan = att.plan_prefill(qo_indptr, kv, head_dim, wide_tiles=wide, template=template)
                out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
                return lambda: att.prefill(q, kv, qo_indptr, plan=plan, params=params, out=out, lse=lse, **scales)

            name = (f"prefill_{template}" + ("" if wide is None else f"_wide={wide}")
                    + ("_ragged" if kv is ragged else ""))
            calls[name] = make
    if large:
        calls.update(_large_calls(att, variant, kernels, head_dim, dtype, rng, kv_dtype, scales))
    return calls


def _large_calls(att, variant, kernels, head_dim: int, dtype: str, rng, kv_dtype: str, scales: dict):
    """The bandwidth- and compute-bound shapes, where a kernel's speed shows rather than its launch: decode of
    32 requests of 4096 keys on the tensor-core template (paged, NHD, pages in a random order), prefill of one
    request of 4096 queries and keys (ragged) on each prefill template the library and device have. Inputs are
    drawn on the device (seeded), the variant's parameters as random_params draws them for these lengths."""
    from types import SimpleNamespace

    import torch

    from attngen.runtime import PagedKV, RaggedKV

    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 31)))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(getattr(torch, kv_dtype))

    def drawn(qo_lens, kv_lens):
        return _device_params(variant, rng, SimpleNamespace(q=np.empty((0, 32, head_dim)), qo_lens=qo_lens,
                                                            kv_lens=kv_lens))

    calls = {}
    if "decode" in kernels:
        batch, pages_per = 32, 4096 // 16
        pages = randn(batch * pages_per, 2, 16, 8, head_dim)
        indices = torch.randperm(batch * pages_per, generator=gen, device="cuda").to(torch.int32)
        indptr = torch.arange(0, batch * pages_per + 1, pages_per, dtype=torch.int32, device="cuda")
        kv = PagedKV(pages, indptr, indices, torch.full((batch,), 16, dtype=torch.int32, device="cuda"), "NHD")
        q = torch.randn(batch, 32, head_dim, generator=gen, device="cuda").to(getattr(torch, dtype))
        params = drawn([1] * batch, [4096] * batch)

        def make_decode():
            plan = att.plan_decode(kv, 32, head_dim, tensor_cores=True)
            out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
            return lambda: att.decode(q, kv, plan=plan, params=params, out=out, lse=lse, **scales)

        calls["decode_large_B32_L4k"] = make_decode
    if "prefill" in kernels:
        n = 4096
        indptr = torch.tensor([0, n], dtype=torch.int32, device="cuda")
        ragged = RaggedKV(randn(n, 8, head_dim), randn(n, 8, head_dim), indptr)
        qp = torch.randn(n, 32, head_dim, generator=gen, device="cuda").to(getattr(torch, dtype))
        params_p = drawn([n], [n])
        hopper = _runs_hopper(att)
        for template in ("mma_sync", "hopper") if hopper else ("mma_sync",):
            def make_prefill(template=template):
                plan = att.plan_prefill(indptr, ragged, head_dim, template=template)
                out, lse = torch.empty_like(qp), torch.empty(qp.shape[:2], device="cuda")
                return lambda: att.prefill(qp, ragged, indptr, plan=plan, params=params_p, out=out, lse=lse, **scales)

            calls[f"prefill_large_L4k_{template}"] = make_prefill
    return calls


def _bits(t):
    """The tensor's bits as integers (NaN payloads compared too)."""
    import torch

    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def compare_builds(variant, *, kernels=("decode", "prefill"), head_dim: int = 128, dtype: str = "float16",
                   kv_dtype: str | None = None, arch: str | None = None, cache=None, repeats: int = 30,
                   large: bool = False) -> dict:
    """Build ``variant`` both ways for this GPU (over a ``kv_dtype`` cache: None for the query dtype), run every
    call of :func:`_calls` on both libraries, and report whether the outputs are bit-identical and each call's
    median milliseconds."""
    import torch

    from attngen.runtime import CUDAAttention
    from attngen.runtime.cuda import current_arch

    from common import bench

    arch = arch or current_arch()
    report = {"variant": variant.name, "arch": arch, "kernels": list(kernels), "kv_dtype": kv_dtype or dtype,
              "build_seconds": {}, "calls": {}}
    libs = {}
    for link in ("whole", "lto"):
        res, secs = _timed_build(variant, _config(link, kernels, head_dim, dtype, arch, kv_dtype), cache)
        report["build_seconds"][link] = round(secs, 2)
        libs[link] = CUDAAttention(variant, res.library, res.manifest)
    calls = {link: _calls(att, variant, kernels, head_dim, dtype, kv_dtype=kv_dtype, large=large)
             for link, att in libs.items()}
    identical = True
    for name in calls["whole"]:
        # planned just before its calls: a later plan of the same shape would take over the plan's workspace
        run = {link: calls[link][name]() for link in ("whole", "lto")}
        outs = {}
        for link in ("whole", "lto"):
            o, lse = run[link]()
            torch.cuda.synchronize()
            outs[link] = (o.clone(), lse.clone())
        same = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(outs["whole"], outs["lto"]))
        diff = float((outs["whole"][0].float() - outs["lto"][0].float()).abs().nan_to_num(0).max())
        identical &= same
        row = {"bit_identical": same, "max_abs_diff": diff}
        for link in ("whole", "lto"):
            row[f"{link}_ms"] = round(bench(run[link], reps=repeats), 4)
        row["lto_over_whole"] = round(row["lto_ms"] / row["whole_ms"], 3)
        report["calls"][name] = row
    report["identical"] = identical
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="logits_softcap", help="a built-in variant (GPU mode)")
    ap.add_argument("--kernels", default="decode,prefill")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--kv-dtype", default=None, help="the cache's K/V dtype, e.g. float8_e4m3fn (default: --dtype)")
    ap.add_argument("--arch", default=None, help="default: this GPU's (required with --compile-only)")
    ap.add_argument("--compile-only", action="store_true", help="time the builds only (no GPU needed)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None, help="also write the JSON report here")
    ap.add_argument("--large", action="store_true", help="also decode B 32 L 4k and prefill L 4k (kernel speed)")
    args = ap.parse_args(argv)
    kernels = tuple(k for k in args.kernels.split(",") if k)
    if args.compile_only:
        if not args.arch:
            ap.error("--compile-only needs --arch")
        report = compile_times(kernels, args.head_dim, args.dtype, args.arch, kv_dtype=args.kv_dtype)
    else:
        from attngen.variants import builtin

        report = compare_builds(builtin(args.variant), kernels=kernels, head_dim=args.head_dim, dtype=args.dtype,
                                kv_dtype=args.kv_dtype, arch=args.arch, repeats=args.repeats,
                                large=args.large)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if report.get("identical", True) else 1


if __name__ == "__main__":
    sys.exit(main())
