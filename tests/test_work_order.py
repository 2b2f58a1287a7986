"""The Hopper template's work order (runtime/work_order.py): cost estimates against a count of each pair's
key tiles, orders as permutations by descending cost, and when plans carry one."""
import numpy as np
import pytest

from attngen.ir.mask_class import constant_bounds
from attngen.runtime.work_order import order_from_costs, pair_costs
from attngen.variants import builtin


def brute_costs(qo_lens, kv_lens, group, q_tiles, rows, keys, lower, upper):
    """Each pair's key tiles holding a key some row of it may see under the bounds, plus one."""
    out = np.zeros((len(qo_lens), q_tiles), np.int64)
    for b, (qo, kv) in enumerate(zip(qo_lens, kv_lens)):
        for t in range(q_tiles):
            r = list(range(t * rows, min((t + 1) * rows, qo * group)))
            if not r:
                continue
            seen = set()
            for row in r:
                pos = kv - qo + row // group
                for j in range(kv):
                    if (lower is None or pos - j >= lower) and (upper is None or pos - j <= upper):
                        seen.add(j // keys)
            out[b, t] = len(seen) + 1
    return out


@pytest.mark.parametrize("lower,upper", [(None, None), (0, None), (0, 40), (-3, 17), (2, None)])
@pytest.mark.parametrize("group", [1, 4, 3])
def test_costs_count_the_key_tiles_a_pair_may_see(lower, upper, group, rng):
    qo_lens = np.array([0, 1, 37, 90, 5, 64])
    kv_lens = np.array([0, 9, 37, 200, 130, 64])
    rows, keys = 32, 16
    q_tiles = -(-int(qo_lens.max()) * group // rows)
    got = pair_costs(qo_lens, kv_lens, group=group, q_tiles=q_tiles, rows=rows, keys=keys, lower=lower, upper=upper)
    want = brute_costs(qo_lens, kv_lens, group, q_tiles, rows, keys, lower, upper)
    # a contiguous key range: the count of its tiles equals the brute count (rows past the request: 0)
    np.testing.assert_array_equal(got, want)


def test_order_is_a_permutation_by_descending_cost(rng):
    costs = rng.integers(0, 9, size=(7, 13))
    order = order_from_costs(costs)
    assert order.dtype == np.int32 and sorted(order.tolist()) == list(range(costs.size))
    flat = costs.reshape(-1)[order]
    assert np.all(np.diff(flat) <= 0)
    ties = order[flat == flat[0]]
    assert np.all(np.diff(ties) > 0)  # ties keep pair order


def test_constant_bounds_of_builtin_masks():
    assert constant_bounds(builtin("vanilla")) == (None, None)
    assert constant_bounds(builtin("causal")) == (0, None)


def test_plans_hand_out_their_order():
    """A plan without lengths (work_order=False, or no Hopper template) passes none, even with a tile map;
    with lengths, the order from the bounds, made once per GQA group, or the tile map's own."""
    import torch

    from attngen.runtime.cuda import PrefillPlan
    from attngen.runtime.tile_map import TileMap

    causal = builtin("causal")
    qo, kv = np.array([300, 0, 40]), np.array([300, 5, 90])
    tm = TileMap(None, None, 1, 128, 128, (), order=torch.arange(3, dtype=torch.int32))
    plain = PrefillPlan(3, 340, 300, ())
    assert plain.work_order(causal, 4, 128, "cpu") is None and plain.work_order(causal, 4, 128, "cpu", tm) is None
    plan = PrefillPlan(3, 340, 300, (), lengths=(qo, kv))
    order = plan.work_order(causal, 4, 128, "cpu")
    q_tiles = -(-300 * 4 // 128)
    assert sorted(order.tolist()) == list(range(3 * q_tiles))
    empty = {q_tiles + t for t in range(q_tiles)} | {2 * q_tiles + t for t in range(2, q_tiles)}  # no rows
    assert order[0].item() // q_tiles == 0 and set(order[-len(empty):].tolist()) == empty  # longest first
    assert plan.work_order(causal, 4, 128, "cpu") is order  # made once per (group, head_dim, device)
    assert plan.work_order(causal, 1, 128, "cpu").numel() == 3 * -(-300 // 128)
    assert plan.work_order(causal, 4, 128, "cpu", tm) is tm.order
    assert plan.ffi_args(None, order)[-2] is order and plan.ffi_args(None, order)[-1] is None  # (no hook pass)


def test_orders_count_the_key_tiles_the_variants_kernel_runs():
    """The costs count key tiles of the tiling the variant's Hopper kernel runs (csrc/hopper_tile.cuh
    hopper_wide_tiles): 176 keys at head_dim 128 and 192 at 64 without a mask hook or key transform over a 16-bit
    cache, 128 with a mask, a key transform or an fp8 cache, and 64 at head_dim 256."""
    from attngen.runtime.cuda import PrefillPlan
    from attngen.schedules.template_prefill_hopper import hopper_config_for

    vanilla, causal, rope = builtin("vanilla"), builtin("causal"), builtin("rope")
    assert hopper_config_for(vanilla, 128).keys == 176 and hopper_config_for(vanilla, 128).q_buffers == 1
    assert hopper_config_for(vanilla, 128, kv_scaled=True).keys == 128
    assert hopper_config_for(causal, 128).keys == 128 and hopper_config_for(rope, 128).keys == 128
    assert hopper_config_for(vanilla, 64).keys == 192 and hopper_config_for(vanilla, 256).keys == 64
    assert hopper_config_for(causal, 64).keys == 128
    # two one-query requests over 176 and 200 keys: one and two 176-key tiles, two 128-key tiles each (a tie,
    # kept in pair order)
    def plan():  # (a plan serves one library: its orders are kept per group, head dim, cache kind and device)
        return PrefillPlan(2, 2, 1, (), lengths=(np.array([1, 1]), np.array([176, 200])))

    vanilla_plan = plan()
    assert vanilla_plan.work_order(vanilla, 1, 128, "cpu").tolist() == [1, 0]
    assert vanilla_plan.work_order(vanilla, 1, 128, "cpu", kv_scaled=True).tolist() == [0, 1]
    assert vanilla_plan.work_order(vanilla, 1, 64, "cpu").tolist() == [1, 0]  # 192-key tiles: one and two
    assert plan().work_order(causal, 1, 128, "cpu").tolist() == [0, 1]


def test_the_variants_traits_carry_the_hopper_tiling():
    """The kernels take their tiling from the traits (csrc/hopper_tile.cuh hopper_wide_tiles reads
    kHopperWideTiles), which carry hopper_config_for's choice: the work order and the kernels agree."""
    from attngen.codegen.cuda_variant import traits_parts
    from attngen.codegen.hooks_cuda import lower_hooks_cuda

    for name, head_dim, wide in [("vanilla", 128, True), ("logits_softcap", 128, True), ("vanilla", 64, True),
                                 ("vanilla", 256, False), ("causal", 128, False), ("rope", 128, False)]:
        v = builtin(name)
        flags, _ = traits_parts(v, lower_hooks_cuda(v, head_dim, "sm_90a"), head_dim)
        assert flags["kHopperWideTiles"] == ("true" if wide else "false"), (name, head_dim)
