"""TVM's PagedKVCache (CPU) with attngen in its slots.

- the merge slot alone: same attention as with TVM's own merge;
- the ("tirx", fn) attention slots called directly with TVM's argument lists: against TVM's own
  CPU kernels and against a float64 reference (byte-offset index arrays, empty requests, sinks
  and window offsets, causal windows with fully masked rows);
- whole caches from ``create_paged_kv_cache`` through add / prefill / append / decode / fork /
  pop-n: against a cache with TVM's kernels and against a float64 model of the cache, for
  vanilla, soft-capped, ALiBi and windowed variants, GQA, inline RoPE, per-layer and per-sequence
  sliding windows.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import pytest
import tvm
from tvm.runtime import ShapeTuple

from attngen.ir import ConfigError
from attngen.tvm import CacheShape, attention_slot_functions, create_paged_kv_cache, merge_slot_function
from attngen.variants import builtin

L, HQ, HKV, D, PS, DTYPE = 2, 8, 2, 32, 16, "float32"
SM_SCALE = D ** -0.5
LAYER_WINDOW = 12  # window of the "mha_sliding" layers in the per-layer sliding-window test
NO_KEY_LSE = -5e4
SHAPE = CacheShape(num_layers=L, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, page_size=PS, max_batch=8,
                   max_total_tokens=1024, prefill_chunk=256)
G = tvm.get_global_func


@pytest.fixture(scope="module")
def tvm_kernels():
    """TVM's own CPU kernels for every slot, built the way TVM's TIRPagedKVCache builds them."""
    from tvm.relax.frontend.nn.llm import kv_cache as kvc
    from tvm.s_tir import dlight as dl

    target = tvm.target.Target.from_device(tvm.cpu())

    def build(f):
        mod = tvm.IRModule({"main": f})
        with target:
            mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
        return tvm.tirx.build(mod["main"], target=target).main

    rs = {}
    return dict(
        append=build(kvc._kv_cache_transpose_append(HKV, D, DTYPE)),
        debug=build(kvc._kv_cache_debug_get_kv(L, HKV, D, DTYPE)),
        ragged=build(kvc._attention_prefill_ragged_cpu(HKV, HQ, D, D, DTYPE, rs)),
        prefill=build(kvc._attention_prefill_cpu(HKV, HQ, D, DTYPE, False, rs)),
        decode=build(kvc._attention_decode_cpu(HKV, HQ, D, DTYPE, False, rs)),
        prefill_sw=build(kvc._attention_prefill_cpu(HKV, HQ, D, DTYPE, True, rs,
                                                    sliding_window_size=LAYER_WINDOW)),
        decode_sw=build(kvc._attention_decode_cpu(HKV, HQ, D, DTYPE, True, rs)),
        tree=build(kvc.tree_attn_cpu(HKV, HQ, D, DTYPE, rs)),
        tree_paged=guarded_tree_order(build(kvc.tree_attn_with_paged_kv_cache_cpu(HKV, HQ, D, DTYPE, rs))),
        merge=build(kvc._merge_state_inplace_cpu(DTYPE)),
        rope=build(kvc.llama_rope_with_position_map(1e4, 1.0, D, HQ, HKV, DTYPE, rs)),
        copy=build(kvc._copy_single_page_cpu(HKV, PS, D, DTYPE)),
        compact=build(kvc._compact_kv_copy_cpu(HKV, D, DTYPE)),
    )


def guarded_tree_order(kernel):
    """TVM's paged tree kernel with guard rows in front of ``tree_order``.

    TVM 0.27's ``_check_tree_order`` evaluates both sides of ``any(col < tree_start, ...)``, so for every
    committed key (col < tree_start) it loads ``tree_order[indptr + col - tree_start]``: up to the sequence's
    length rows before the array. The runtime hands the kernel a view into its own host buffer, and where
    that view starts a page, the load faults (a segfault in roughly one random tree script in nine). The
    loaded values are discarded, so a copy with readable rows in front gives TVM's intended result."""
    def call(*args):
        kernel(*args[:15], offset_view(args[15].numpy(), pad=2 * SHAPE.max_total_tokens))  # [tree nodes, 2]

    return tvm.runtime.convert(call)


def make_cache(k, merge, *, attn=None, kinds=("mha",) * L, support_sliding_window=False, rope_mode=0):
    """A cache with TVM's kernels; ``attn``: role -> function replacing TVM's attention slots."""
    attn = attn or {"prefill_ragged": k["ragged"], "prefill": k["prefill"], "decode": k["decode"],
                    "prefill_sliding_window": k["prefill_sw"], "decode_sliding_window": k["decode_sw"]}
    kind_ids = {"mha": 0, "mha_sliding": 3}
    return G("vm.builtin.paged_attention_kv_cache_create")(
        ShapeTuple([8, 1024, 256, PS, int(support_sliding_window), LAYER_WINDOW]), ShapeTuple([0, L]), HQ, HKV,
        D, D, ShapeTuple([kind_ids[x] for x in kinds]), False, rope_mode, 1.0, 1e4, None,
        tvm.runtime.empty((), DTYPE, device=tvm.cpu()), k["append"], None,
        ["tirx", attn["prefill_ragged"]], ["tirx", attn["prefill"]], ["tirx", attn["decode"]],
        ["tirx", attn["prefill_sliding_window"]], ["tirx", attn["decode_sliding_window"]],
        ["tirx", k["tree_paged"]], ["tirx", k["tree"]], [], [merge],
        k["rope"], k["copy"], k["debug"], k["compact"])


def tensor(a):
    return tvm.runtime.tensor(np.ascontiguousarray(a), device=tvm.cpu())


def offset_view(values, pad: int = 3):
    """An int32 tensor that is a view at a nonzero byte offset into a larger allocation."""
    a = np.asarray(values, np.int32)
    base = tensor(np.concatenate([np.full(pad, -7, np.int32), a.ravel()]))
    return base._create_view(a.shape, "int32", relative_byte_offset=4 * pad)


# ---------------------------------------------------------------------------------------------
# float64 references


def tvm_rope(x, pos, scale=1.0, theta=1e4):
    """TVM's rotate-half RoPE of rows x [n, H, D] at positions pos [n], in float64."""
    d = x.shape[-1]
    idx = np.arange(d)
    angle = (np.asarray(pos, np.float64) * scale)[:, None] / theta ** ((2 * idx % d) / d)[None, :]  # [n, D]
    partner = np.where(idx < d // 2, -np.roll(x, -(d // 2), axis=-1), np.roll(x, d // 2, axis=-1))
    return np.cos(angle)[:, None, :] * x + np.sin(angle)[:, None, :] * partner


def attend(q, k, v, qo_pos, kv_pos, *, visible=None, logits=None):
    """Softmax attention in float64. q [n, Hq, D], k/v [m, Hkv, D], positions [n] / [m];
    visible(qo_pos [n,1], kv_pos [1,m]) -> bool [n, m] or [Hq, n, m]; logits(s [Hq,n,m], qo_pos,
    kv_pos) -> s. Returns (o [n, Hq, D], lse [n, Hq] base 2; rows without keys: 0 and -5e4)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("ihd,jhd->hij", q, k) * SM_SCALE
    qp, kp = np.asarray(qo_pos)[:, None], np.asarray(kv_pos)[None, :]
    if logits is not None:
        s = logits(s, qp, kp)
    mask = np.broadcast_to(visible(qp, kp) if visible is not None else True, s.shape)
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    p = np.where(mask, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    denom = p.sum(axis=-1, keepdims=True)
    o = np.einsum("hij,jhd->ihd", p / np.where(denom > 0, denom, 1), v)
    with np.errstate(divide="ignore"):
        lse = np.where(denom > 0, (np.log(denom) + np.where(np.isfinite(m), m, 0)) / np.log(2), NO_KEY_LSE)
    return o, lse[..., 0].T


@dataclass
class Semantics:
    """What a cache computes, for the float64 model."""

    logits: Callable | None = None  # (s [Hq, n, m], qo_pos [n, 1], kv_pos [1, m]) -> s
    mask: Callable | None = None  # (qo_pos, kv_pos) -> bool, on top of causal
    layer_windows: dict = field(default_factory=dict)  # layer -> window (query included)
    inline_rope: bool = False


class ReferenceCache:
    """A float64 model of a PagedKVCache: per sequence and layer, the raw k/v of its kept tokens."""

    def __init__(self, sem: Semantics):
        self.sem = sem
        self.seqs: dict[int, dict] = {}
        self.windows: dict[int, tuple] = {}  # sequence -> (window, sink): keep sinks + latest tokens

    def window(self, s, window, sink):
        self.windows[s] = (window, sink)

    def add(self, s):
        self.seqs[s] = {"k": [np.zeros((0, HKV, D))] * L, "v": [np.zeros((0, HKV, D))] * L}

    def fork(self, parent, child, pos=-1):
        n = len(self.seqs[parent]["k"][0]) if pos == -1 else pos
        self.seqs[child] = {key: [x[:n] for x in val] for key, val in self.seqs[parent].items()}

    def popn(self, s, n):
        self.seqs[s] = {key: [x[:len(x) - n] for x in val] for key, val in self.seqs[s].items()}

    def length(self, s):
        return len(self.seqs[s]["k"][0])

    def step(self, ids, lens, qkvs):
        """Outputs [sum(lens), Hq, D] per layer; appends the new tokens (and slides windows)."""
        outs = [np.zeros((sum(lens), HQ, D)) for _ in range(L)]
        start = 0
        for s, n in zip(ids, lens):
            seq = self.seqs[s]
            for layer in range(L):
                qkv = qkvs[layer][start:start + n].astype(np.float64)
                q, k_new, v_new = qkv[:, :HQ], qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:]
                k = np.concatenate([seq["k"][layer], k_new])
                v = np.concatenate([seq["v"][layer], v_new])
                kv_pos = np.arange(len(k))  # kept tokens (slid sequences renumber, as TVM does)
                qo_pos = kv_pos[len(k) - n:]
                window = self.sem.layer_windows.get(layer)

                def visible(qp, kp, window=window):
                    ok = kp <= qp
                    if window:
                        ok = ok & (qp - kp < window)
                    return ok & self.sem.mask(qp, kp) if self.sem.mask else ok

                if self.sem.inline_rope:
                    q, k = tvm_rope(q, qo_pos), tvm_rope(k, kv_pos)
                outs[layer][start:start + n] = attend(q, k, v, qo_pos, kv_pos, visible=visible,
                                                      logits=self.sem.logits)[0]
                seq["k"][layer] = np.concatenate([seq["k"][layer], k_new])
                seq["v"][layer] = np.concatenate([seq["v"][layer], v_new])
                if s in self.windows and len(seq["k"][layer]) > self.windows[s][0]:
                    window, sink = self.windows[s]
                    for key in ("k", "v"):
                        x = seq[key][layer]
                        seq[key][layer] = np.concatenate([x[:sink], x[len(x) - (window - sink):]])
            start += n
        return outs


def run_flow(caches: dict, ref: ReferenceCache, script, rng) -> dict:
    """Drive every cache and the model through ``script``; name -> list of [n, Hq, D] outputs
    (one per step and layer, the model's under "reference")."""
    outs = {name: [] for name in caches} | {"reference": []}
    for op, *args in script:
        if op == "step":
            ids, lens = args
            n = sum(lens)
            qkvs = [rng.standard_normal((n, HQ + 2 * HKV, D)).astype(DTYPE) for _ in range(L)]
            for name, kv in caches.items():
                G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(ids), ShapeTuple(lens))
                for layer in range(L):
                    out = tensor(np.full((n, HQ, D), np.nan, DTYPE))
                    G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")(
                        kv, layer, SM_SCALE, tensor(qkvs[layer]), out)
                    outs[name].append(out.numpy())
                G("vm.builtin.kv_state_end_forward")(kv)
            outs["reference"] += ref.step(ids, lens, qkvs)
            continue
        builtin_name = {"add": "kv_state_add_sequence", "fork": "kv_state_fork_sequence",
                        "popn": "kv_state_popn",
                        "window": "attention_kv_cache_enable_sliding_window_for_seq"}[op]
        for kv in caches.values():
            G(f"vm.builtin.{builtin_name}")(kv, *args)
        getattr(ref, op)(*args)
    for kv in caches.values():  # the caches agree with the model on every sequence's length
        for s in ref.seqs:
            assert G("vm.builtin.attention_kv_cache_get_sequence_length")(kv, s) == ref.length(s)
    return outs


# prefill, append (ragged + paged parts merged), a second sequence mixed with an append, forks
# (whole and mid-sequence), batch decode, pop-n
MHA_SCRIPT = [
    ("add", 0), ("step", [0], [20]), ("step", [0], [5]),
    ("add", 1), ("step", [1, 0], [7, 2]),
    ("fork", 0, 2, -1), ("step", [2], [3]),
    ("step", [0, 1, 2], [1, 1, 1]), ("step", [0, 1, 2], [1, 1, 1]), ("step", [0, 1, 2], [1, 1, 1]),
    ("popn", 2, 2), ("step", [0, 2], [2, 1]),
    ("fork", 1, 3, 4), ("step", [3], [2]), ("step", [3, 1], [1, 1]),
]


def max_err(a, b):
    return max(float(np.abs(np.asarray(x, np.float64) - y).max()) for x, y in zip(a, b))


def assert_close(outs, name, other, tol):
    assert len(outs[name]) == len(outs[other]) > 0
    for a in outs[name]:
        assert np.isfinite(a).all(), f"{name}: non-finite output"
    err = max_err(outs[name], outs[other])
    assert err < tol, f"{name} vs {other}: max error {err:.3g} (tol {tol:.3g})"


@pytest.fixture(scope="module")
def kernel_cache(build_cache):
    return build_cache


def attngen_cache(variant, kernel_cache, params=None, **shape):
    """A cache of SHAPE (with ``shape``'s changes) whose slots run ``variant``."""
    return create_paged_kv_cache(replace(SHAPE, **shape), variant, params=params, cache=kernel_cache)


# ---------------------------------------------------------------------------------------------
# the merge slot alone


def test_attngen_merge_in_tvm_paged_kv_cache(tvm_kernels, rng):
    merge = merge_slot_function(DTYPE)
    calls = []

    def counted_merge(*args):
        calls.append(args[0].shape)
        return merge(*args)

    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"]),
              "attngen": make_cache(tvm_kernels, tvm.runtime.convert(counted_merge))}
    outs = run_flow(caches, ReferenceCache(Semantics()), MHA_SCRIPT, rng)
    assert len(calls) >= L  # the cache merged ragged and paged states through attngen's function
    assert_close(outs, "attngen", "tvm", 1e-5)


# ---------------------------------------------------------------------------------------------
# the attention slots called directly


def test_slots_match_tvm_kernels_with_offset_index_arrays(tvm_kernels, kernel_cache, rng):
    """Ragged, paged and decode slots against TVM's kernels: GQA, an empty request, index arrays
    at byte offsets, a per-sequence sliding window with sinks, positions not starting at 0."""
    slots = attention_slot_functions(SHAPE, cache=kernel_cache)
    qo_indptr, qo_total = [0, 5, 5, 12], 12
    q = rng.standard_normal((qo_total, HQ, D)).astype(DTYPE)
    q_pos = np.array([3, 4, 5, 6, 7, 40, 41, 42, 43, 44, 45, 46], np.int32)
    k_offset = np.array([3, 0, 40], np.int32)
    k = rng.standard_normal((qo_total, HKV, D)).astype(DTYPE)
    v = rng.standard_normal((qo_total, HKV, D)).astype(DTYPE)
    pages = rng.standard_normal((10, 2, HKV, PS, D)).astype(DTYPE)
    page_indptr, page_indices = [0, 2, 2, 5], [7, 1, 3, 0, 9]
    last = [5, 0, 16]
    length_info = {False: np.array(last, np.int32),
                   True: np.array([last, [3, 0, 6], [2, 0, 4]], np.int32)}  # (last, window offset, sink)
    calls = {"ragged": ("prefill_ragged", lambda: (
        tensor(q), offset_view(qo_indptr), tensor(k), tensor(v), offset_view(qo_indptr), offset_view(q_pos),
        offset_view(k_offset)), (1,))}
    for sw in (False, True):
        suffix = "_sliding_window" if sw else ""
        calls[f"prefill{suffix}"] = (f"prefill{suffix}", lambda sw=sw: (
            tensor(q), offset_view(qo_indptr), tensor(pages), offset_view(page_indptr),
            offset_view(page_indices), offset_view(length_info[sw]), offset_view(k_offset),
            offset_view(q_pos + 20)), (0,))
        calls[f"decode{suffix}"] = (f"decode{suffix}", lambda sw=sw: (
            tensor(q[:3]), tensor(pages), offset_view(page_indptr), offset_view(page_indices),
            offset_view(length_info[sw]), offset_view(k_offset), offset_view([60, 2, 70])), ())
    tvm_of = {"prefill_ragged": "ragged", "prefill": "prefill", "decode": "decode",
              "prefill_sliding_window": "prefill_sw", "decode_sliding_window": "decode_sw"}
    for role, make_args, causal in calls.values():
        results = {}
        for name, fn in (("tvm", tvm_kernels[tvm_of[role]]), ("attngen", slots[role])):
            args = make_args()
            n = args[0].shape[0]
            o, lse = tensor(np.full((n, HQ, D), np.nan, DTYPE)), tensor(np.full((n, HQ), np.nan, "float32"))
            fn(*args, o, lse, *causal, 0, 1.0, 1e4, SM_SCALE)
            results[name] = (o.numpy(), lse.numpy())
        (o_tvm, lse_tvm), (o_ag, lse_ag) = results["tvm"], results["attngen"]
        assert np.isfinite(o_ag).all() and np.isfinite(lse_ag).all(), role
        assert np.abs(o_ag - o_tvm).max() < 1e-5, role
        assert np.abs(lse_ag - lse_tvm).max() < 1e-4, role
    # the request without pages: TVM's "no key" convention
    o, lse = tensor(np.full((3, HQ, D), np.nan, DTYPE)), tensor(np.full((3, HQ), np.nan, "float32"))
    slots["decode"](*calls["decode"][1](), o, lse, 0, 1.0, 1e4, SM_SCALE)
    assert (o.numpy()[1] == 0).all() and (lse.numpy()[1] == NO_KEY_LSE).all()


def test_sliding_window_prefill_slot_causal_window_vs_reference(kernel_cache, rng):
    """The paged sliding-window prefill slot with causal=1: sinks, a window offset, a positional
    window, rows that see no key (TVM's own kernel gives NaN there), inline RoPE; float64 reference."""
    W = 6
    for inline in (False, True):
        shape = replace(SHAPE, attn_kinds=("mha_sliding",) * L, sliding_window=W,
                        rope_mode="inline" if inline else "none")
        slots = attention_slot_functions(shape, cache=kernel_cache)
        pages = rng.standard_normal((6, 2, HKV, PS, D)).astype(DTYPE)
        page_indptr, page_indices = [0, 2, 3], [4, 1, 5]
        # request 0: sink 2 + window keys from offset 9 of 2 pages, last page holding 7 -> 2 + 14 keys
        # request 1: 5 keys, no sink
        length_info = np.array([[7, 5], [9, 0], [2, 0]], np.int32)
        k_offset = np.array([30, 100], np.int32)
        qo_indptr = [0, 9, 12]
        q_pos = np.array([45, 46, 47, 48, 49, 50, 51, 52, 53, 104, 105, 106], np.int32)
        q = rng.standard_normal((12, HQ, D)).astype(DTYPE)
        o, lse = tensor(np.full((12, HQ, D), np.nan, DTYPE)), tensor(np.full((12, HQ), np.nan, "float32"))
        slots["prefill_sliding_window"](
            tensor(q), offset_view(qo_indptr), tensor(pages), offset_view(page_indptr), offset_view(page_indices),
            offset_view(length_info), offset_view(k_offset), offset_view(q_pos), o, lse, 1, int(inline), 1.0, 1e4,
            SM_SCALE)
        o, lse = o.numpy(), lse.numpy()
        for b, (seq_offsets, rows) in enumerate([(list(range(2)) + list(range(9, 23)), range(0, 9)),
                                                 (list(range(5)), range(9, 12))]):
            ids = page_indices[page_indptr[b]:page_indptr[b + 1]]
            keys = np.stack([pages[ids[p // PS], 0, :, p % PS] for p in seq_offsets])
            vals = np.stack([pages[ids[p // PS], 1, :, p % PS] for p in seq_offsets])
            kv_pos = k_offset[b] + np.arange(len(seq_offsets))
            qr, qp = q[list(rows)], q_pos[list(rows)]
            if inline:
                qr, keys = tvm_rope(qr.astype(np.float64), qp), tvm_rope(keys.astype(np.float64), kv_pos)
            ref_o, ref_lse = attend(qr, keys, vals, qp, kv_pos, visible=lambda a, c: (c <= a) & (a - c < W))
            assert np.abs(o[list(rows)] - ref_o).max() < 2e-5
            assert np.abs(lse[list(rows)] - ref_lse).max() < 1e-4
        no_key = lse[:, 0] == NO_KEY_LSE
        assert no_key.sum() == 3 and (o[no_key] == 0).all()  # queries 51..53: keys end at 45
        assert not no_key.all()


def test_slot_built_for_one_rotary_mode_refuses_the_other(kernel_cache, rng):
    slots = attention_slot_functions(SHAPE, cache=kernel_cache)
    q = rng.standard_normal((2, HQ, D)).astype(DTYPE)
    pages = rng.standard_normal((2, 2, HKV, PS, D)).astype(DTYPE)
    with pytest.raises(Exception, match="rotary_mode"):
        slots["decode"](tensor(q), tensor(pages), tensor(np.array([0, 1, 2], np.int32)),
                        tensor(np.array([0, 1], np.int32)), tensor(np.array([3, 4], np.int32)),
                        tensor(np.zeros(2, np.int32)), tensor(np.array([3, 4], np.int32)),
                        tensor(np.zeros((2, HQ, D), DTYPE)), tensor(np.zeros((2, HQ), "float32")), 1, 1.0, 1e4,
                        SM_SCALE)


@pytest.mark.parametrize("variant, why", [("sigmoid", "unnormalised sum"), ("attention_sink", "output_transform"),
                                           ("custom_mask", "reads 'batch'")])
def test_variants_tvm_cannot_merge_are_refused(variant, why):
    with pytest.raises(ConfigError, match=why):
        attention_slot_functions(SHAPE, builtin(variant))


def test_cuda_targets_are_routed_or_refused_clearly():
    with pytest.raises(NotImplementedError, match=r"create_paged_kv_cache\(\.\.\., target='cuda'\)"):
        attention_slot_functions(SHAPE, target="cuda")
    with pytest.raises(ValueError, match="rope_mode 'inline'.*use convention='tirx'"):
        create_paged_kv_cache(replace(SHAPE, dtype="float16", rope_mode="inline"), target="cuda",
                              convention="flashinfer")
    with pytest.raises(ValueError, match="rope_mode 'normal' .support_sliding_window=True makes it inline.*tirx"):
        create_paged_kv_cache(replace(SHAPE, dtype="float16", support_sliding_window=True, rope_mode="normal"),
                              target="cuda", convention="flashinfer")


def test_cache_shape_is_validated_once():
    with pytest.raises(ValueError, match="num_qo_heads 8 is not a multiple of num_kv_heads 3"):
        replace(SHAPE, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"attn_kinds \['mha'\]: give one of"):
        replace(SHAPE, attn_kinds=("mha",))
    with pytest.raises(ValueError, match="choose one"):
        replace(SHAPE, attn_kinds=("mha_sliding", "mha"), support_sliding_window=True)
    with pytest.raises(ValueError, match="rope_mode 'yarn'"):
        replace(SHAPE, rope_mode="yarn")
    shape = replace(SHAPE, rope_mode="Normal", support_sliding_window=True)
    assert shape.rope_mode == 1 and shape.inline_rope and shape.attn_kinds == ("mha", "mha")
    assert shape.sizes == [8, 1024, 256, PS, 1, 1024] and shape.layer_window == 0


# ---------------------------------------------------------------------------------------------
# whole caches


@pytest.mark.parametrize("rope_mode", ["none", "inline"])
def test_vanilla_cache_matches_tvm_kernels_and_reference(tvm_kernels, kernel_cache, rope_mode, rng):
    mode = {"none": 0, "inline": 2}[rope_mode]
    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"], rope_mode=mode),
              "attngen": attngen_cache(None, kernel_cache, rope_mode=rope_mode)}
    outs = run_flow(caches, ReferenceCache(Semantics(inline_rope=rope_mode == "inline")), MHA_SCRIPT, rng)
    assert_close(outs, "attngen", "tvm", 1e-5)
    assert_close(outs, "attngen", "reference", 2e-5)


def _softcap(cap):
    return lambda s, qp, kp: cap * np.tanh(s / cap)


def _alibi(slopes):
    return lambda s, qp, kp: s + slopes[:, None, None] * (kp - qp)[None].astype(np.float64)


@pytest.mark.parametrize("name", ["logits_softcap", "alibi", "sliding_window_causal", "rope"])
def test_variant_cache_matches_reference(kernel_cache, name, rng):
    """Non-trivial variants through the whole flow (a scalar compiled in, a tensor bound per call, a
    mask, query and key transforms at TVM's positions); each result differs clearly from vanilla."""
    slopes = (2.0 ** -np.arange(1, HQ + 1)).astype("float32")
    params, sem = {
        "logits_softcap": ({"soft_cap": 1.5}, Semantics(logits=_softcap(1.5))),
        "alibi": ({"alibi_slopes": slopes}, Semantics(logits=_alibi(slopes))),
        "sliding_window_causal": ({"window_left": 5}, Semantics(mask=lambda qp, kp: qp - kp <= 5)),
        "rope": ({}, Semantics(inline_rope=True)),  # its defaults: TVM's RoPE with scale 1, theta 1e4
    }[name]
    caches = {"attngen": attngen_cache(builtin(name), kernel_cache, params=params)}
    seed = int(rng.integers(1 << 31))
    outs = run_flow(caches, ReferenceCache(sem), MHA_SCRIPT, np.random.default_rng(seed))
    assert_close(outs, "attngen", "reference", 2e-5)
    vanilla = run_flow({}, ReferenceCache(Semantics()), MHA_SCRIPT, np.random.default_rng(seed))["reference"]
    assert max_err(outs["attngen"], vanilla) > 0.05


def test_layer_sliding_window_cache(tvm_kernels, kernel_cache, rng):
    """A "mha_sliding" layer next to a full one; every chunk fits the window, where TVM's split
    (unwindowed new-token part + windowed cached part) is an exact sliding window."""
    kinds = ("mha_sliding", "mha")
    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"], kinds=kinds),
              "attngen": attngen_cache(None, kernel_cache, attn_kinds=kinds, sliding_window=LAYER_WINDOW)}
    script = [("add", 0), ("add", 1), ("step", [0, 1], [10, 7]), ("step", [0], [9]),
              ("step", [0, 1], [1, 1]), ("step", [0, 1], [1, 1]), ("step", [0, 1], [1, 1]),
              ("popn", 1, 2), ("step", [0, 1], [3, 12]), ("step", [1, 0], [1, 1])]
    seed = int(rng.integers(1 << 31))
    outs = run_flow(caches, ReferenceCache(Semantics(layer_windows={0: LAYER_WINDOW})), script,
                    np.random.default_rng(seed))
    assert_close(outs, "attngen", "reference", 2e-5)
    finite = [np.isfinite(x) for x in outs["tvm"]]  # TVM's kernel gives NaN to rows it fully masks
    assert max(float(np.abs(a - b)[f].max()) for a, b, f in zip(outs["attngen"], outs["tvm"], finite)) < 1e-5
    full = run_flow({}, ReferenceCache(Semantics()), script, np.random.default_rng(seed))["reference"]
    assert max_err(outs["attngen"][0::L], full[0::L]) > 0.05  # the window changed layer 0 ...
    assert max_err(outs["attngen"][1::L], full[1::L]) < 2e-5  # ... and only layer 0


def test_sequence_sliding_window_with_sinks(tvm_kernels, kernel_cache, rng):
    """Per-sequence windows with attention sinks (StreamingLLM): the cache drops tokens, the
    sliding-window slots read sinks + window through length_info[3, B]."""
    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"], support_sliding_window=True),
              "attngen": attngen_cache(None, kernel_cache, support_sliding_window=True)}
    script = [("add", 0), ("window", 0, 24, 4), ("add", 1), ("window", 1, 20, 2),
              ("step", [0, 1], [20, 9]), ("step", [0], [5]), ("step", [0, 1], [1, 1]), ("step", [0, 1], [9, 14]),
              ("step", [0, 1], [1, 1]), ("step", [1, 0], [1, 3])]
    outs = run_flow(caches, ReferenceCache(Semantics()), script, rng)
    assert_close(outs, "attngen", "tvm", 1e-5)
    assert_close(outs, "attngen", "reference", 2e-5)
