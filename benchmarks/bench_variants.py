"""What a variant's hooks cost in prefill: attngen's prefill templates (the FA2-class mma.sync one, and on
sm_90 the Hopper one) per variant and hook-math mode, against the plain kernel, FlashInfer (fa2, fa3; its
own soft-cap) and SDPA in the same run.

bf16, D 128 (``--head-dim``), Hq 32 / Hkv 8, one request of L 8k; TFLOP/s of the visible work (4 * D * Hq per visible
score). Two groups, each against its own plain row: full attention (plain, soft-cap, ALiBi, RoPE applied by the
query and key hooks) and causal
attention (plain causal, a causal sliding window of 1024 keys with FlashInfer's window_left as its peer,
a custom bit mask that shows every causal key: the tile map finds every tile below the diagonal full, so
only the diagonal tiles read the mask; Gemma 2's local layers, soft-cap 50 under a causal window of 4096,
with FlashInfer's soft-cap and window and FlexAttention as peers; a prefix-LM of a 2048-key prefix, its
prefix lengths a tensor parameter, with FlexAttention and its block mask as the peer). ``approx`` / ``precise``: the build's ``hook_math`` (hardware
approximations in the hooks, or the CUDA math library).

    python benchmarks/bench_variants.py --out benchmarks/results --commit <sha>
"""
from __future__ import annotations

import torch

from common import (VARIANT_PARAMS, alibi_slopes, bench, cell, error_lines, flex_call, guarded, load_flashinfer,
                    result_parser, run_info, write_results)

L, HQ, HKV, D = 8192, 32, 8, 128
TEMPLATES = ["mma_sync"]  # plus "hopper" on compute capability 9.0 (set in main)
KEYS = {"mma_sync": "attngen", "hopper": "attngen_hopper"}
SOFT_CAP = VARIANT_PARAMS["logits_softcap"]["soft_cap"]
ROPE = VARIANT_PARAMS["rope"]
WINDOW = 1024  # keys visible before the query position (FlashInfer's window_left)
GEMMA_CAP, GEMMA_WINDOW = 50.0, 4096  # Gemma 2's local layers (examples/gemma2_softcap_window.py)
PREFIX = 2048  # prefix-LM: every query sees the first PREFIX keys, then causal (examples/prefix_lm.py)
# (row name, built-in variant, hook math, params, the plain row it is compared with)
CASES = [
    ("plain", "vanilla", "approx", {}, "plain"),
    ("soft-cap 30, approx", "logits_softcap", "approx", {"soft_cap": SOFT_CAP}, "plain"),
    ("soft-cap 30, precise", "logits_softcap", "precise", {"soft_cap": SOFT_CAP}, "plain"),
    ("ALiBi", "alibi", "approx", "alibi", "plain"),
    ("RoPE in the query / key hooks", "rope", "approx", ROPE, "plain"),
    ("attention sink (output hook)", "attention_sink", "approx", "sink", "plain"),
    ("causal", "causal", "approx", {}, "causal"),
    (f"causal window {WINDOW}", "sliding_window_causal", "approx", {"window_left": WINDOW}, "causal"),
    ("custom mask (causal bits)", "custom_mask", "approx", "causal_bits", "causal"),
    (f"Gemma-2 local: soft-cap {GEMMA_CAP:g}, causal window {GEMMA_WINDOW}", "gemma2_softcap_window", "approx",
     {"soft_cap": GEMMA_CAP, "window_left": GEMMA_WINDOW}, "causal"),
    (f"prefix-LM, prefix {PREFIX}", "prefix_lm", "approx", "prefix", "causal"),
]
# the rows of examples/ (the others are built-ins)
EXAMPLES = {"gemma2_softcap_window", "prefix_lm"}


def visible_scores(variant: str) -> int:
    """Scores the row's variant lets through, of the L x L square."""
    if variant in ("causal", "custom_mask"):
        return L * (L + 1) // 2
    if variant == "sliding_window_causal":
        return sum(min(i, WINDOW) + 1 for i in range(L))
    if variant == "gemma2_softcap_window":
        return sum(min(i, GEMMA_WINDOW) + 1 for i in range(L))
    if variant == "prefix_lm":
        return sum(max(PREFIX, i + 1) for i in range(L))
    return L * L


def load_variant(name: str):
    """A built-in variant, or the one of examples/<name>.py."""
    if name not in EXAMPLES:
        from attngen.variants import builtin

        return builtin(name)
    import runpy
    from pathlib import Path

    return runpy.run_path(str(Path(__file__).parents[1] / "examples" / f"{name}.py"))["variant"]


def flex_peer(variant: str, q, k, v):
    """FlexAttention on the row's mask (and soft-cap), its block mask made once: milliseconds per call."""
    if variant == "prefix_lm":
        def mask_mod(b, h, qi, ki):
            return (ki < PREFIX) | (qi >= ki)
        score_mod = None
    else:  # Gemma 2's local layers
        def mask_mod(b, h, qi, ki):
            return (qi >= ki) & (qi - ki <= GEMMA_WINDOW)

        def score_mod(score, b, h, qi, ki):
            return GEMMA_CAP * torch.tanh(score / GEMMA_CAP)
    fn, _ = flex_call(q, k, v, mask_mod, score_mod)
    return bench(fn, reps=20)


def causal_bits():
    """The custom mask's parameters for one causal request of L keys (packed on the host, then moved)."""
    import numpy as np

    from attngen.runtime.custom_mask import pack_custom_mask

    packed = pack_custom_mask([np.tri(L, L, dtype=bool)], [L])
    return {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in packed.items()}


def main():
    global D
    ap = result_parser(__doc__)
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="time attngen's rows only")
    ap.add_argument("--cases", default="", help="comma-separated prefixes of the row names to time (default: all; "
                    "a row whose plain row is left out is compared with itself)")
    ap.add_argument("--head-dim", type=int, default=D, choices=(64, 128, 256), help="D (default 128)")
    args = ap.parse_args()
    D = args.head_dim
    from attngen.runtime import CUDAAttention, RaggedKV

    torch.manual_seed(0)
    q = torch.randn(L, HQ, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(L, HKV, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(L, HKV, D, dtype=torch.bfloat16, device="cuda")
    indptr = torch.tensor([0, L], dtype=torch.int32, device="cuda")
    kv = RaggedKV(k, v, indptr)
    slopes = alibi_slopes(HQ)
    fi, fi_version = load_flashinfer()
    TEMPLATES[:] = ["mma_sync"] + (["hopper"] if torch.cuda.get_device_capability()[0] == 9 else [])
    res = {**run_info(args.commit), "shape": {"L": L, "Hq": HQ, "Hkv": HKV, "D": D}}
    res["flashinfer"] = fi_version
    rows = []
    by_name = {}
    picked = [c for c in CASES if not args.cases or any(c[0].startswith(p) for p in args.cases.split(","))]
    for name, variant, math_mode, params, plain in picked:  # attngen first: FlashInfer's JIT may take minutes
        att = CUDAAttention.build(load_variant(variant), head_dims=(D,), dtypes=("bfloat16",), layouts=("NHD",),
                                  kernels=("prefill",), hook_math=math_mode)
        p = {"alibi_slopes": slopes} if params == "alibi" else causal_bits() if params == "causal_bits" else \
            {"prefix_len": torch.tensor([PREFIX], dtype=torch.int32, device="cuda")} if params == "prefix" else \
            {"sink": torch.linspace(-2.0, 2.0, HQ, device="cuda")} if params == "sink" else params
        out = torch.full_like(q, float("nan"))
        lse = torch.empty(L, HQ, device="cuda")
        flops = 4 * visible_scores(variant) * D * HQ
        row = {"case": name, "variant": variant, "flops": flops, "plain": plain}
        for template in TEMPLATES:
            plan = att.plan_prefill(indptr, kv, D, template=template)
            ms = bench(lambda: att.prefill(q, kv, indptr, plan=plan, params=p, out=out, lse=lse), reps=20)
            row[KEYS[template]] = flops / ms / 1e9
            base = by_name.get(plain, row)
            row[f"vs_plain_{template}"] = row[KEYS[template]] / base[KEYS[template]]
        row["vs_plain"] = row["vs_plain_mma_sync"]
        rows.append(row)
        by_name[name] = row
        print(rows[-1], flush=True)
    for row in rows if args.peers else ():
        variant, flops = row.pop("variant"), row["flops"]
        if fi is not None and variant in ("vanilla", "logits_softcap", "causal", "sliding_window_causal",
                                          "gemma2_softcap_window"):
            cap = {"logits_softcap": SOFT_CAP, "gemma2_softcap_window": GEMMA_CAP}.get(variant)
            causal = variant in ("causal", "sliding_window_causal", "gemma2_softcap_window")
            window = {"sliding_window_causal": WINDOW, "gemma2_softcap_window": GEMMA_WINDOW}.get(variant, -1)
            for backend in ("fa2", "fa3"):
                t = guarded(row, f"flashinfer_{backend}", lambda: bench(lambda: fi.single_prefill_with_kv_cache(
                    q, k, v, causal=causal, logits_soft_cap=cap, window_left=window, backend=backend), reps=20))
                if t is not None:
                    row[f"flashinfer_{backend}"] = flops / t / 1e9
        if fi is not None and variant == "rope":  # FlashInfer's fused RoPE (fa2; its fa3 path has none)
            t = guarded(row, "flashinfer_fa2", lambda: bench(lambda: fi.single_prefill_with_kv_cache(
                q, k, v, pos_encoding_mode="ROPE_LLAMA", **ROPE, backend="fa2"), reps=20))
            if t is not None:
                row["flashinfer_fa2"] = flops / t / 1e9
        if variant in ("gemma2_softcap_window", "prefix_lm"):
            t = guarded(row, "flex", lambda: flex_peer(variant, q, k, v))
            if t is not None:
                row["flex"] = flops / t / 1e9
        if variant in ("vanilla", "causal"):
            qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            t = guarded(row, "sdpa", lambda: bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                qt, kt, vt, is_causal=variant == "causal", enable_gqa=True), reps=20))
            if t is not None:
                row["sdpa"] = flops / t / 1e9
        print(row, flush=True)
    res["rows"] = rows
    lines = [f"# Variant cost in prefill — {res['gpu']}, {res['date']}, commit {args.commit}", "",
             f"bf16, D {D}, Hq {HQ} / Hkv {HKV}, one request of L {L}; TFLOP/s of the visible work; 'vs plain': "
             f"against the row named in brackets. FlashInfer {fi_version} with its own logits_soft_cap and "
             f"window_left where the row has one.", "",
             "| case | attngen mma.sync | vs plain | attngen Hopper | vs plain | FlashInfer fa2 | FlashInfer fa3 | SDPA "
             "| FlexAttention |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        hopper_vs = f"{r['vs_plain_hopper']:.2f}" if "vs_plain_hopper" in r else "—"
        lines.append(f"| {r['case']} ({r['plain']}) | {cell(r['attngen'])} | {r['vs_plain']:.2f} | "
                     f"{cell(r.get('attngen_hopper'))} | "
                     f"{hopper_vs} | {cell(r.get('flashinfer_fa2'))} | {cell(r.get('flashinfer_fa3'))} | "
                     f"{cell(r.get('sdpa'))} | {cell(r.get('flex'))} |")
    lines += error_lines(res["rows"], lambda r: r["case"])
    write_results(args.out, f"variants_{res['date']}", res, lines)


if __name__ == "__main__":
    main()
