"""Packed documents: several documents in one request's token row, causal inside each, the document of
every position from a tensor parameter (examples/document_mask.py). attngen derives the mask's tile map on
the device (runtime/tile_map.py) and its Hopper template walks it, dealt longest first (runtime/work_order.py)
and in plain tile order (plan_prefill(work_order=False), which must give the same bits); against the same
variant without the map, the same visible work as plain causal attention over the documents as separate
requests (attngen's causal variant on a ragged batch: the ceiling a map can reach), FlashInfer fa3 on that
ragged batch, and FlexAttention with its block mask (create_block_mask timed too) -- in the same run, same timer.

Cases: 16 documents of mixed length packed in one 16k row, and 64 in one 32k row (bf16, Hq 32 / Hkv 8,
D 128). TFLOP/s of the visible work: 4 * D * Hq * (visible query-key pairs).

    python benchmarks/bench_packed_docs.py --out benchmarks/results --commit <sha> [--no-peers]
"""
from __future__ import annotations

import runpy
import time
from pathlib import Path

import numpy as np
import torch

from common import bench, cell, flex_call, guarded, load_flashinfer, result_parser, run_info, write_results

HQ, HKV, D = 32, 8, 128
CASES = {"16 docs in 16k": (16384, 16), "64 docs in 32k": (32768, 64)}
MAP_BUILDS = 7  # fresh map derivations per case whose median build time is reported


def doc_lengths(total: int, docs: int, rng) -> np.ndarray:
    cuts = np.sort(rng.choice(np.arange(1, total), size=docs - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [total]]))


def classifier_ms(att, tm, qo_indptr, kv, params) -> float:
    """Device time of the map's classifier kernel alone (a ragged view: its indptr gives the lengths)."""
    classify = att.function("prefill_tile_map", "bfloat16", D)
    total = int(qo_indptr[-1])
    q_tiles, k_tiles = -(-total * (HQ // HKV) // tm.rows), -(-total // tm.keys)
    cls = torch.zeros((1, tm.heads, q_tiles, k_tiles), dtype=torch.uint8, device="cuda")
    row_keys = torch.zeros((tm.heads * q_tiles, tm.rows, 2), dtype=torch.int32, device="cuda")
    return bench(lambda: classify(qo_indptr, kv.indptr, None, 0, cls, row_keys, None, None, HQ // HKV, HKV, 0,
                                  tm.rows, tm.keys, params["doc_ids"]), reps=10)


def fresh_map(att, q, kv, qo_indptr, params, queued=None):
    """A fresh derivation of the mask's tile map (a new plan's, made by its first call); ``queued``: a mapped
    plan whose call (about one layer's attention) is queued first, so that the host runs ahead of the device as in
    a model's step."""
    plan = att.plan_prefill(qo_indptr, kv, D)
    if queued is not None:
        torch.cuda.synchronize()
        att.prefill(q, kv, qo_indptr, plan=queued, params=params)
    att.prefill(q, kv, qo_indptr, plan=plan, params=params)
    torch.cuda.synchronize()
    (tile_map,) = plan.maps.values()
    return tile_map


def main():
    ap = result_parser(__doc__)
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="time attngen only")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    args = ap.parse_args()
    from attngen.runtime import CUDAAttention, RaggedKV
    from attngen.variants import builtin

    res = run_info(args.commit)
    rng = np.random.default_rng(0)
    docs_variant = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "document_mask.py"))["variant"]
    att_docs = CUDAAttention.build(docs_variant, head_dims=(D,), dtypes=("bfloat16",), kernels=("prefill",))
    att_causal = CUDAAttention.build(builtin("causal"), head_dims=(D,), dtypes=("bfloat16",), kernels=("prefill",))
    fi = load_flashinfer()[0] if args.peers else None
    rows = []
    for name, (total, ndocs) in CASES.items():
        lens = doc_lengths(total, ndocs, rng)
        visible = int(sum(n * (n + 1) // 2 for n in lens))
        flops = 4.0 * D * HQ * visible
        row = {"case": name, "doc_lengths": lens.tolist(), "visible_fraction": visible / (total * (total + 1) / 2)}
        q = torch.randn(total, HQ, D, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(total, HKV, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(total, HKV, D, dtype=torch.bfloat16, device="cuda")
        one = torch.tensor([0, total], dtype=torch.int32, device="cuda")
        ids = torch.repeat_interleave(torch.arange(ndocs, dtype=torch.int32, device="cuda"),
                                      torch.tensor(lens, device="cuda"))[None]
        params = {"doc_ids": ids}
        kv_one = RaggedKV(k, v, one)
        outs = {}
        # mapped in tile order: the map's work dealt as the kernel walks it without a plan's order (A/B of
        # runtime/work_order.py on the same map)
        for label, tile_map, order in (("attngen_mapped", None, None), ("attngen_mapped_tile_order", None, False),
                                       ("attngen_unmapped", False, None)):
            if label == "attngen_mapped":  # a throwaway map first: the classifier's first launch loads its module
                att_docs.prefill(q, kv_one, one, plan=att_docs.plan_prefill(one, kv_one, D), params=params)
            plan = att_docs.plan_prefill(one, kv_one, D, tile_map=tile_map, work_order=order)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            att_docs.prefill(q, kv_one, one, plan=plan, params=params)  # the map is derived here, once
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            ms = bench(lambda: att_docs.prefill(q, kv_one, one, plan=plan, params=params), reps=10)
            row[label] = flops / ms / 1e9
            outs[label] = att_docs.prefill(q, kv_one, one, plan=plan, params=params)[0]
            if label == "attngen_mapped":
                (tm,) = plan.maps.values()
                row["map_counts"] = tm.counts
                row["map_build_first_ms"], row["map_build_host_first_ms"] = tm.build_ms, tm.build_host_ms
                # the build's times as the median of fresh derivations (new plans), not one sample
                builds = [(m.build_ms, m.build_host_ms, dict(m.build_host_steps))
                          for m in (fresh_map(att_docs, q, kv_one, one, params) for _ in range(MAP_BUILDS))]
                row["map_build_ms"] = float(np.median([b[0] for b in builds]))
                row["map_build_host_ms"] = float(np.median([b[1] for b in builds]))  # the host's wall time of its calls
                row["map_build_host_steps_ms"] = {k: float(np.median([b[2][k] for b in builds])) for k in builds[0][2]}
                # the same with the host ahead: the events around the build span its kernels, not the host's calls
                row["map_build_host_ahead_ms"] = float(np.median(
                    [fresh_map(att_docs, q, kv_one, one, params, queued=plan).build_ms for _ in range(MAP_BUILDS)]))
                row["first_call_ms"], row["mapped_ms"] = first_ms, ms
                row["map_classifier_ms"] = guarded(row, "map_classifier_ms",
                                                   lambda: classifier_ms(att_docs, tm, one, kv_one, params))
        row["order_changes_nothing"] = bool(torch.equal(outs["attngen_mapped"], outs["attngen_mapped_tile_order"]))
        row["mapped_vs_unmapped_maxdiff"] = float((outs["attngen_mapped"].float() - outs["attngen_unmapped"].float())
                                                  .abs().max())
        # the same visible work as plain causal attention: the documents as separate requests
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
        kv_docs = RaggedKV(k, v, indptr)
        plan_c = att_causal.plan_prefill(indptr, kv_docs, D)
        ms = bench(lambda: att_causal.prefill(q, kv_docs, indptr, plan=plan_c), reps=10)
        row["attngen_causal_ragged"] = flops / ms / 1e9
        ref = att_causal.prefill(q, kv_docs, indptr, plan=plan_c)[0]
        row["mapped_vs_ragged_causal_maxdiff"] = float((outs["attngen_mapped"].float() - ref.float()).abs().max())
        if fi is not None:
            def fa3():
                ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
                w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa3")
                w.plan(indptr, indptr, HQ, HKV, D, causal=True, q_data_type=q.dtype)
                return flops / bench(lambda: w.run(q, k, v), reps=10) / 1e9

            row["flashinfer_fa3_ragged"] = guarded(row, "flashinfer_fa3_ragged", fa3)

        if args.peers:
            def flex():
                doc = ids[0]

                def mask_mod(b, h, qi, ki):
                    return (doc[qi] == doc[ki]) & (qi >= ki)

                fx, row["flex_create_block_mask_ms"] = flex_call(q, k, v, mask_mod)
                ms_ = bench(fx, reps=10)
                out = fx()[0].transpose(0, 1)
                row["flex_maxdiff"] = float((out.float() - ref.float()).abs().max())
                return flops / ms_ / 1e9

            row["flex"] = guarded(row, "flex", flex)
        rows.append(row)
        print(row, flush=True)
    res["rows"] = rows
    cols = ["attngen_mapped", "attngen_mapped_tile_order", "attngen_unmapped", "attngen_causal_ragged",
            "flashinfer_fa3_ragged", "flex"]
    lines = [f"# Packed documents — {res['gpu']}, {res['date']}, commit {args.commit}", "",
             "TFLOP/s of the visible work (bf16, Hq 32 / Hkv 8, D 128; causal inside each document, document ids "
             "from a tensor parameter). attngen_causal_ragged: the same documents as separate requests of the "
             "causal variant (the same visible work without a mask). Map build: the median of "
             f"{MAP_BUILDS} fresh derivations (device time between two events, and the host's wall time of its "
             "calls), beside one layer's mapped attention; 'host ahead': the same with one layer's attention queued "
             "before each derivation, as in a model's step, so the events span the build's kernels.", "",
             "| case | visible | " + " | ".join(cols)
             + " | mapped / causal ragged | one layer ms (mapped) | map build ms | its host calls ms"
             " | map build ms, host ahead | classifier ms | map (empty/partial/full) |",
             "|---|---|" + "---|" * (len(cols) + 7)]
    for r in rows:
        cells = [f"{r[c]:.0f}" if r.get(c) else "—" for c in cols]
        mc = r.get("map_counts", {})
        lines.append(f"| {r['case']} | {r['visible_fraction']:.1%} | " + " | ".join(cells)
                     + f" | {r['attngen_mapped'] / r['attngen_causal_ragged']:.2f} | {cell(r.get('mapped_ms'), '.2f')}"
                     + f" | {r.get('map_build_ms', 0):.2f}"
                     + f" | {cell(r.get('map_build_host_ms'), '.2f')} | {cell(r.get('map_build_host_ahead_ms'), '.3f')}"
                     + f" | {cell(r.get('map_classifier_ms'), '.3f')}"
                     + f" | {mc.get('empty')}/{mc.get('partial')}/{mc.get('full')} |")
    steps = [f"{r['case']}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["map_build_host_steps_ms"].items())
             for r in rows if r.get("map_build_host_steps_ms")]
    if steps:
        lines += ["", "The host's calls by step (ms, medians): " + "; ".join(steps) + "."]
    write_results(args.out, f"packed_docs_{res['date']}{args.tag}", res, lines)


if __name__ == "__main__":
    main()
