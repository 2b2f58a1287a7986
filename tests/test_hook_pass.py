"""The row-hook pass's choice and workspace size (runtime/hook_pass.py), on the CPU: the size mirrors
csrc/hook_pass.cuh's layout (ragged keys in the view's strides, paged ones packed, queries, an identity page
table), each part 256-byte aligned; the GPU tests check the two agree (test_gpu_hook_pass.py)."""
import pytest

from attngen.runtime import PagedKV, RaggedKV
from attngen.runtime import hook_pass as hp
from attngen.variants import builtin

torch = pytest.importorskip("torch")


def test_workspace_bytes_follow_the_views_strides():
    rope = builtin("rope")
    q = torch.zeros(10, 8, 64, dtype=torch.float16)
    k = torch.zeros(30, 2, 64, dtype=torch.float16)
    kv = RaggedKV(k, k.clone(), torch.tensor([0, 30], dtype=torch.int32))
    keys = (29 * 128 + 64 + 64) * 2  # the last row's last element, in the view's strides
    assert hp.workspace_bytes(rope, q, kv, 64) == -(-keys // 256) * 256 + 10 * 8 * 64 * 2
    wide = torch.zeros(30, 3, 2, 64, dtype=torch.float16)[:, 0]  # rows 3 x 2 x 64 elements apart
    kv = RaggedKV(wide, wide, torch.tensor([0, 30], dtype=torch.int32))
    assert hp.workspace_bytes(rope, q, kv, 64) == -(-(29 * 384 + 128) * 2 // 256) * 256 + 10 * 8 * 64 * 2
    for layout, shape in (("NHD", (5, 2, 16, 2, 64)), ("HND", (5, 2, 2, 16, 64))):
        pages = torch.zeros(*shape, dtype=torch.float16)
        kv = PagedKV(pages, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([4, 0, 2], dtype=torch.int32),
                     torch.tensor([7], dtype=torch.int32), layout)
        # three table entries' pages (K and V), the queries, three page ids
        assert hp.workspace_bytes(rope, q, kv, 64) == 3 * 2 * 16 * 2 * 64 * 2 + 10 * 8 * 64 * 2 + 3 * 4
    # pools whose pages do not lie within their page stride (vLLM's [2, P, ...] cache transposed, a pool whose
    # page stride is smaller than a page) or reach far past it (every layer's pages in one pool): packed all the same
    table = (torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
             torch.tensor([3], dtype=torch.int32))
    for pages in (torch.zeros(2, 5, 16, 2, 64, dtype=torch.float16).transpose(0, 1),
                  torch.zeros(16, 2, 5, 2, 64, dtype=torch.float16).permute(2, 1, 0, 3, 4),
                  torch.zeros(5, 32, 2, 16, 2, 64, dtype=torch.float16)[:, 7]):
        kv = PagedKV(pages, *table, "NHD")
        assert hp.workspace_bytes(rope, q, kv, 64) == 1 * 2 * 16 * 2 * 64 * 2 + 10 * 8 * 64 * 2 + 1 * 4


def test_the_automatic_choice():
    rope, vanilla = builtin("rope"), builtin("vanilla")
    assert hp.wanted(rope, None, hp.AUTO_MIN_ROWS) and not hp.wanted(rope, None, hp.AUTO_MIN_ROWS - 1)
    assert hp.wanted(rope, True, 1) and not hp.wanted(rope, False, 10_000)
    assert not hp.wanted(vanilla, None, 10_000) and not hp.wanted(vanilla, True, 10_000)
