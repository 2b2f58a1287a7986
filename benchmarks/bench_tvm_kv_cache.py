"""TVM PagedKVCache on the GPU: attngen's CUDA slots vs TVM's own TIR CUDA kernels, per layer call.

Times ``vm.builtin.attention_kv_cache_attention_with_fused_qkv`` (append of the new k/v, then
attention) for one layer, fp16, Hq 32 / Hkv 8, D 128, page 16, in two caches that differ only
in their attention and merge slots (attngen in both slot conventions): decode (batch 32 and 8, 2k / 8k context, one new token per
sequence) and prefill (one sequence, 2k new tokens on an empty cache, and 512 new tokens after
4k cached). Device-event medians after warm-up; repeated calls inside one forward rewrite the
same positions. Writes JSON and a Markdown table.

    python benchmarks/bench_tvm_kv_cache.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import json

import numpy as np

from common import bench, cell, result_parser, run_info, write_results

HQ, HKV, D, PS, DTYPE = 32, 8, 128, 16, "float16"
PREFILL_CHUNK = 4096
CASES = [  # (name, batch, cached tokens per sequence, new tokens per sequence)
    ("decode B32 ctx 2k", 32, 2048, 1),
    ("decode B8 ctx 8k", 8, 8192, 1),
    ("prefill 2k", 1, 0, 2048),
    ("append 512 after 4k", 1, 4096, 512),
]


def make_cache(which: str, max_tokens: int):
    from attngen.tvm import CacheShape, create_paged_kv_cache
    from attngen.tvm.baseline import create_tvm_tir_cache_cuda

    shape = CacheShape(num_layers=1, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, page_size=PS,
                       max_batch=32, max_total_tokens=max_tokens, prefill_chunk=PREFILL_CHUNK)
    if which.startswith("attngen"):
        return create_paged_kv_cache(shape, target="cuda", convention="flashinfer" if which == "attngen_fi" else "tirx")
    return create_tvm_tir_cache_cuda(shape)


def time_case(kv, batch: int, cached: int, new: int, rng) -> tuple[float, np.ndarray]:
    import tvm
    from tvm.runtime import ShapeTuple

    G = tvm.get_global_func
    ids = list(range(batch))
    for s in ids:
        G("vm.builtin.kv_state_add_sequence")(kv, s)
    step = max(1, PREFILL_CHUNK // batch)  # one forward holds at most the cache's prefill chunk of tokens
    for start in range(0, cached, step):  # fill the context in chunks
        n = min(step, cached - start)
        G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(ids), ShapeTuple([n] * batch))
        qkv = tvm.runtime.tensor(rng.standard_normal((n * batch, HQ + 2 * HKV, D)).astype(DTYPE), device=tvm.cuda())
        out = tvm.runtime.empty((n * batch, HQ, D), DTYPE, device=tvm.cuda())
        G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")(kv, 0, D ** -0.5, qkv, out)
        G("vm.builtin.kv_state_end_forward")(kv)
    G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(ids), ShapeTuple([new] * batch))
    qkv = tvm.runtime.tensor(rng.standard_normal((new * batch, HQ + 2 * HKV, D)).astype(DTYPE), device=tvm.cuda())
    out = tvm.runtime.empty((new * batch, HQ, D), DTYPE, device=tvm.cuda())
    fn = G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")
    ms = bench(lambda: fn(kv, 0, D ** -0.5, qkv, out), reps=30)
    result = out.numpy().astype(np.float32)
    G("vm.builtin.kv_state_end_forward")(kv)
    return ms, result


def pages_needed(batch: int, cached: int, new: int) -> int:
    """Tokens of whole pages the case occupies (each sequence's last page is allocated whole)."""
    return batch * -(-(cached + new) // PS) * PS


def main():
    import tvm

    args = result_parser(__doc__).parse_args()
    res = run_info(args.commit) | {"cases": []}
    max_tokens = max(pages_needed(b, c, n) for _, b, c, n in CASES) + 4 * PS
    caches, build_errors = {}, {}
    for which in ("attngen", "attngen_fi", "tvm"):  # one cache each (TVM's kernels compile once), cleared per case
        try:
            caches[which] = make_cache(which, max_tokens)
        except Exception as e:  # noqa: BLE001
            build_errors[which] = f"{type(e).__name__}: {e}"[:300]
    for name, batch, cached, new in CASES:
        row = {"case": name} | {f"{w}_error": e for w, e in build_errors.items()}
        outs = {}
        for which, kv in caches.items():
            try:
                tvm.get_global_func("vm.builtin.kv_state_clear")(kv)
                row[f"{which}_ms"], outs[which] = time_case(kv, batch, cached, new, np.random.default_rng(0))
            except Exception as e:  # noqa: BLE001
                row[f"{which}_error"] = f"{type(e).__name__}: {e}"[:300]
        if "attngen" in outs and "tvm" in outs:
            row["max_abs_diff"] = float(np.abs(outs["attngen"] - outs["tvm"]).max())
        if "attngen_fi" in outs and "tvm" in outs:
            row["max_abs_diff_fi"] = float(np.abs(outs["attngen_fi"] - outs["tvm"]).max())
        if row.get("attngen_ms") and row.get("tvm_ms"):
            row["speedup"] = row["tvm_ms"] / row["attngen_ms"]
        res["cases"].append(row)
        print(json.dumps(row), flush=True)
    lines = [f"# TVM PagedKVCache attention per layer call, {DTYPE}, Hq {HQ} / Hkv {HKV}, D {D}, page {PS} — "
             f"{res['gpu']}, {res['date']}, commit {res['commit']}", "",
             "| case | attngen tirx slots ms | attngen flashinfer slots ms | TVM TIR kernels ms | TVM / attngen tirx "
             "| max abs diff tirx / flashinfer |", "|---|---|---|---|---|---|"]
    for r in res["cases"]:
        lines.append(f"| {r['case']} | {cell(r.get('attngen_ms'), '.3f')} | {cell(r.get('attngen_fi_ms'), '.3f')} | "
                     f"{cell(r.get('tvm_ms'), '.3f')} | "
                     f"{cell(r.get('speedup'), '.2f')} | {cell(r.get('max_abs_diff'), '.2e')} / "
                     f"{cell(r.get('max_abs_diff_fi'), '.2e')} |")
    write_results(args.out, f"tvm_kv_cache_{res['date']}", res, lines)


if __name__ == "__main__":
    main()
