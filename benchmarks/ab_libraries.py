"""A/B timing of template revisions: libraries built from several git revisions, timed in one GPU run.

A template change (tile shape, stage count, loop order) is a compile-time choice, so comparing two of them
means two libraries. ``build`` compiles them on any machine with nvcc (no GPU): for every revision, the
``attngen`` package of that revision builds the causal prefill library and the vanilla decode library
(bf16, D 128, NHD, one arch) into ``OUT/<label>/``. ``run`` (on the GPU) loads every library with the
current runtime, times the cases of ``bench_prefill.py`` and ``bench_decode.py`` on the same inputs with
FlashInfer in the same run, and reports each revision's numbers and its max abs difference from the
first revision's output.

    python benchmarks/ab_libraries.py build --out ab --rev main --rev my-branch --arch sm_90a
    python benchmarks/ab_libraries.py run ab --out benchmarks/results --tag my-change
"""
from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
D = 128
KINDS = {"prefill": "causal", "decode": "vanilla"}  # kernels -> the variant its library is built for


# The revision's tensor-core decode stage count and shared memory per stage count, read in its own tree:
# from the template record where the revision has the registry, else from its Python tile mirror.
MIRROR_PROBE = """import json
from attngen.runtime.decode_plan import decode_tc_stages as s
try:
    from attngen.schedules.template_decode_tc import DECODE_TC, DecodeTCConfig
    from attngen.schedules.dtypes import ElementBytes
    b = lambda d, k: DECODE_TC.smem_bytes(DecodeTCConfig(d, k), ElementBytes(2, 2))
except ImportError:
    from attngen.schedules.tiles import decode_tc_smem_bytes as b
print(json.dumps({{'stages': s({D}), 'smem': {{k: b({D}, k) for k in (1, 2, 3, 4)}}}}))
"""


def label_of(rev: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in rev)


def build(args) -> None:
    out = Path(args.out).resolve()
    for rev in args.rev:
        sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.strip()
        dest = out / label_of(rev)
        shutil.rmtree(dest, ignore_errors=True)
        with tempfile.TemporaryDirectory() as tree:
            archive = subprocess.run(["git", "archive", rev, "attngen"], cwd=ROOT, check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
            for kernels, variant in KINDS.items():
                # run from the revision's tree so that its attngen package (python mirrors included) builds
                subprocess.run([sys.executable, "-m", "attngen.cli", "build", variant, "--target", "cuda",
                                "--arch", args.arch, "--head-dim", str(D), "--dtype", "bfloat16", "--layout", "NHD",
                                "--kernels", kernels, "--out", str(dest / kernels), "--cache-dir", args.cache_dir],
                               cwd=tree, check=True)
            mirror = subprocess.run(
                [sys.executable, "-c", MIRROR_PROBE.format(D=D)],
                cwd=tree, check=True, capture_output=True, text=True).stdout
        for kernels in KINDS:  # keep what the run needs: the library and its manifest
            for f in (dest / kernels).iterdir():
                if f.suffix != ".so" and f.name != "manifest.json":
                    f.unlink()
        fused = subprocess.run(["git", "grep", "-q", "merge_counters", rev, "--", "attngen/csrc/decode.cuh"],
                               cwd=ROOT).returncode == 0  # the revision's decode kernel can merge split requests
        (dest / "revision.json").write_text(json.dumps({"rev": rev, "commit": sha, "decode_tc": json.loads(mirror),
                                                        "fused_merge": fused}))
        print(f"{rev} ({sha}) -> {dest}")


def ctas_per_sm_of(mirror: dict, scale: int = 1):
    """The occupancy rule fed with the revision's own stage count and shared memory, for the planner;
    ``scale`` > 1 plans that many waves of CTAs (revision.json "ctas_scale": a planner-only variant)."""
    from attngen.runtime.decode_plan import decode_tc_stage_order, resident_ctas

    needs = [mirror["smem"][str(s)] for s in decode_tc_stage_order(mirror["stages"])]
    return lambda head_dim, smem_per_sm, smem_optin: scale * resident_ctas(needs, smem_per_sm, smem_optin)


def run(args) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_decode import CASES as DECODE_CASES, HEAD_DIM, PAGE, make_case
    from bench_prefill import CASES as PREFILL_CASES, HQ, make_case as make_prefill_case
    from common import bench, copy_bandwidth
    from attngen.runtime import CUDAAttention, PagedKV, RaggedKV, decode_plan
    from attngen.variants import builtin

    revs = []
    for d in sorted(Path(args.dir).iterdir()):
        if (d / "revision.json").is_file():
            revs.append((d.name, json.loads((d / "revision.json").read_text()), d))
    order = {r: i for i, r in enumerate(args.order or [])}
    revs.sort(key=lambda r: order.get(r[0], len(order)))

    def module(d: Path, kernels: str):
        so = next((d / kernels).glob("*.so"))
        return CUDAAttention(builtin(KINDS[kernels]), so)

    prefill_mods = {name: module(d, "prefill") for name, _, d in revs}  # loaded once, every case reuses them
    decode_mods = {name: module(d, "decode") for name, _, d in revs}

    try:
        import flashinfer
    except Exception:  # noqa: BLE001
        flashinfer = None
    res = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "revisions": {name: meta["commit"] for name, meta, _ in revs}, "prefill": [], "decode": []}
    for name, L in PREFILL_CASES:
        q, k, v, indptr = make_prefill_case(L)
        kv = RaggedKV(k, v, indptr)
        flops = 2 * 2 * L * L / 2 * D * HQ
        row, first = {"case": name}, None
        for rname, _, _ in revs:
            m = prefill_mods[rname]
            plan = m.plan_prefill(indptr, kv, D)
            out = torch.full_like(q, float("nan"))
            lse = torch.empty(L, HQ, device="cuda")
            row[rname] = flops / bench(lambda: m.prefill(q, kv, indptr, plan=plan, out=out, lse=lse), reps=20) / 1e9
            first = out.float() if first is None else first
            row[rname + "_maxdiff"] = float((out.float() - first).abs().nan_to_num(float("inf")).max())
        if flashinfer is not None:
            row["flashinfer_fa2"] = flops / bench(lambda: flashinfer.single_prefill_with_kv_cache(
                q, k, v, causal=True, backend="fa2"), reps=20) / 1e9
        res["prefill"].append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, kv
    copy = copy_bandwidth()
    res["copy_GBps"] = copy
    original = decode_plan.decode_tc_ctas_per_sm
    for name, kv_lens, hq, hkv, d in DECODE_CASES:
        if d != HEAD_DIM:  # the revisions' libraries are built at HEAD_DIM
            continue
        q, pages, indptr, indices, last = make_case(kv_lens, hq, hkv)
        kv = PagedKV(pages, indptr, indices, last, "NHD")
        nbytes = sum(kv_lens) * hkv * HEAD_DIM * 2 * 2 + 2 * q.numel() * 2
        row, first = {"case": name}, None
        for rname, meta, _ in revs:
            decode_plan.decode_tc_ctas_per_sm = ctas_per_sm_of(meta["decode_tc"], meta.get("ctas_scale", 1))
            try:
                m = decode_mods[rname]
                plan = m.plan_decode(kv, hq, HEAD_DIM, fused_merge=None if meta.get("fused_merge") else False)
                out = torch.full_like(q, float("nan"))
                lse = torch.empty(q.shape[:2], device="cuda")
                row[rname] = nbytes / (bench(lambda: m.decode(q, kv, plan=plan, out=out, lse=lse)) * 1e-3) / 1e9
            finally:
                decode_plan.decode_tc_ctas_per_sm = original
            first = out.float() if first is None else first
            row[rname + "_maxdiff"] = float((out.float() - first).abs().nan_to_num(float("inf")).max())
        if flashinfer is not None:
            ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
            for tc in (False, True):
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
                w.plan(indptr, indices, last, hq, hkv, HEAD_DIM, PAGE, q_data_type=torch.bfloat16,
                       kv_data_type=torch.bfloat16)
                row["flashinfer_tc" if tc else "flashinfer_cuda_core"] = nbytes / (bench(lambda: w.run(q, pages))
                                                                                  * 1e-3) / 1e9
        res["decode"].append(row)
        print(json.dumps(row), flush=True)
        del q, pages, kv
        torch.cuda.empty_cache()
    write(res, Path(args.out), args.tag)


def write(res: dict, out: Path, tag: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"ab_{res['date']}" + (f"_{tag}" if tag else "")
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1))
    names = list(res["revisions"])
    lines = [f"# A/B of template revisions — {res['gpu']}, {res['date']}", "",
             "Revisions: " + ", ".join(f"{n} = {c}" for n, c in res["revisions"].items()) +
             f". Copy bandwidth in the same run: {res['copy_GBps']:.0f} GB/s. Max abs diff against the first "
             "revision's output in parentheses.", ""]
    for kind, unit, peers in (("prefill", "TFLOP/s", ["flashinfer_fa2"]),
                              ("decode", "GB/s", ["flashinfer_cuda_core", "flashinfer_tc"])):
        lines += [f"{kind} ({unit}):", "", "| case | " + " | ".join(names + peers) + " |",
                  "|---|" + "---|" * (len(names) + len(peers))]
        for row in res[kind]:
            cells = [f"{row[n]:.0f} ({row[n + '_maxdiff']:.2g})" for n in names]
            cells += [f"{row[p]:.0f}" if p in row else "-" for p in peers]
            lines.append(f"| {row['case']} | " + " | ".join(cells) + " |")
        lines.append("")
    (out / f"{stem}.md").write_text("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the libraries of each revision (no GPU needed)")
    b.add_argument("--rev", action="append", required=True, help="a git revision (repeatable)")
    b.add_argument("--out", required=True)
    b.add_argument("--arch", default="sm_90a")
    b.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "attngen-ab-cache"))
    r = sub.add_parser("run", help="time every built revision on the GPU")
    r.add_argument("dir")
    r.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    r.add_argument("--tag", default="")
    r.add_argument("--order", nargs="*", help="revision labels in report order (the first is the reference)")
    args = ap.parse_args()
    build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    main()
