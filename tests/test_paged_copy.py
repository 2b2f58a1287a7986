"""attngen.testing.paged_copy: ragged keys and values copied into page pools of any page size (NHD and HND, pages
in random order or in order, a request without keys among them) read back as the same rows through the page
table."""
import numpy as np
import pytest

from attngen.runtime.reference import gather_pages
from attngen.testing import paged_copy


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page", [1, 8, 16, 256])
@pytest.mark.parametrize("shuffled", [True, False])
def test_pages_read_back_as_the_ragged_rows(layout, page, shuffled, rng):
    import torch

    kv_lens = [500, 0, 70, 64]
    k, v = torch.randn(sum(kv_lens), 8, 16), torch.randn(sum(kv_lens), 8, 16)
    indptr = np.concatenate([[0], np.cumsum(kv_lens)])
    paged = paged_copy(k, v, indptr, page, layout, rng if shuffled else None)
    assert paged.pages.shape[2 if layout == "NHD" else 3] == page
    in_order = np.array_equal(paged.indices.numpy(), np.arange(len(paged.indices)))
    assert in_order != shuffled or page == 256  # (the 3 pages of 256 rows may come out in order)
    keys, values = gather_pages(paged.pages.numpy(), paged.indptr.numpy(), paged.indices.numpy(),
                                paged.last_page_len.numpy(), layout)
    for b in range(len(kv_lens)):
        np.testing.assert_array_equal(keys[b], k[indptr[b]:indptr[b + 1]].numpy())
        np.testing.assert_array_equal(values[b], v[indptr[b]:indptr[b + 1]].numpy())
