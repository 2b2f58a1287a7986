"""TVM's PagedKVCache (CPU) with attngen's merge in its merge slot gives the same attention as with
TVM's own merge, through prefill, decode, fork and pop-n steps."""
import numpy as np
import pytest
import tvm
from tvm.runtime import ShapeTuple

from attngen.runtime.tvm_kv_cache import merge_slot_function

L, HQ, HKV, D, PS, DTYPE = 2, 8, 2, 64, 16, "float32"


@pytest.fixture(scope="module")
def tvm_kernels():
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
        prefill_sw=build(kvc._attention_prefill_cpu(HKV, HQ, D, DTYPE, True, rs)),
        decode_sw=build(kvc._attention_decode_cpu(HKV, HQ, D, DTYPE, True, rs)),
        tree=build(kvc.tree_attn_cpu(HKV, HQ, D, DTYPE, rs)),
        tree_paged=build(kvc.tree_attn_with_paged_kv_cache_cpu(HKV, HQ, D, DTYPE, rs)),
        merge=build(kvc._merge_state_inplace_cpu(DTYPE)),
        rope=build(kvc.llama_rope_with_position_map(1e4, 1.0, D, HQ, HKV, DTYPE, rs)),
        copy=build(kvc._copy_single_page_cpu(HKV, PS, D, DTYPE)),
        compact=build(kvc._compact_kv_copy_cpu(HKV, D, DTYPE)),
    )


def make_cache(k, merge):
    from tvm.relax.frontend.nn.llm.kv_cache import AttnKind, RopeMode

    return tvm.get_global_func("vm.builtin.paged_attention_kv_cache_create")(
        ShapeTuple([8, 1024, 256, PS, 0, 1024]), ShapeTuple([0, L]), HQ, HKV, D, D,
        ShapeTuple([int(AttnKind.MHA)] * L), False, int(RopeMode.NORMAL), 1.0, 1e4, None,
        tvm.runtime.empty((), DTYPE, device=tvm.cpu()), k["append"], None,
        ["tirx", k["ragged"]], ["tirx", k["prefill"]], ["tirx", k["decode"]], ["tirx", k["prefill_sw"]],
        ["tirx", k["decode_sw"]], ["tirx", k["tree_paged"]], ["tirx", k["tree"]], [], [merge],
        k["rope"], k["copy"], k["debug"], k["compact"])


def test_attngen_merge_in_tvm_paged_kv_cache(tvm_kernels):
    G = tvm.get_global_func
    merge = merge_slot_function(DTYPE)
    calls = []

    def counted_merge(*args):
        calls.append(args[0].shape)
        return merge(*args)

    caches = {"tvm": make_cache(tvm_kernels, tvm_kernels["merge"]),
              "attngen": make_cache(tvm_kernels, tvm.runtime.convert(counted_merge))}
    rng = np.random.default_rng(0)
    outs = {name: [] for name in caches}

    def step(seq_ids, lens):
        n = sum(lens)
        qkvs = [rng.standard_normal((n, HQ + 2 * HKV, D)).astype(DTYPE) for _ in range(L)]
        for name, kv in caches.items():
            G("vm.builtin.kv_state_begin_forward")(kv, ShapeTuple(seq_ids), ShapeTuple(lens))
            for layer in range(L):
                out = tvm.runtime.empty((n, HQ, D), DTYPE, device=tvm.cpu())
                G("vm.builtin.attention_kv_cache_attention_with_fused_qkv")(
                    kv, layer, D ** -0.5, tvm.runtime.tensor(qkvs[layer], tvm.cpu()), out)
                outs[name].append(out.numpy())
            G("vm.builtin.kv_state_end_forward")(kv)

    for kv in caches.values():
        G("vm.builtin.kv_state_add_sequence")(kv, 0)
    step([0], [20])  # prefill
    step([0], [5])  # append: ragged part + paged part, merged by the merge slot
    for kv in caches.values():
        G("vm.builtin.kv_state_fork_sequence")(kv, 0, 1, -1)
    step([1], [3])
    step([0, 1], [1, 1])  # batch decode
    for kv in caches.values():
        G("vm.builtin.kv_state_popn")(kv, 1, 2)
        assert G("vm.builtin.attention_kv_cache_get_sequence_length")(kv, 1) == 27  # 25 + 3 + 1 - 2
    step([0, 1], [2, 1])
    for kv in caches.values():
        assert [G("vm.builtin.attention_kv_cache_get_sequence_length")(kv, s) for s in (0, 1)] == [28, 28]
    assert len(outs["tvm"]) == len(outs["attngen"]) == 5 * L
    assert len(calls) >= L  # the cache merged ragged and paged states through attngen's function
    for a, b in zip(outs["tvm"], outs["attngen"]):
        assert np.isfinite(b).all()
        assert np.abs(a - b).max() < 1e-5
