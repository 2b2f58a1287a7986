"""The row-hook pass of a prefill call: where it serves, and its workspace (csrc/hook_pass.cuh).

A variant's key transform runs, inside the prefill templates, on every K/V tile each query tile reads: a
request of n query tiles transforms each of its keys n times. The pass applies the key (and query) transform
once per row into a workspace ahead of the prefill, which then reads plain keys and queries. The rows are
rounded to the cache's element type as the templates round their transformed tiles; results agree with the
per-tile hooks' to rounding (the hook's float math may contract into FMAs differently in the two kernels).
"""
from __future__ import annotations

from attngen.ir.hook_spec import row_hooks
from attngen.runtime.checks import AttentionArgumentError
from attngen.runtime.views import PagedKV, RaggedKV

# the workspace's parts start 256-byte aligned (csrc/hook_pass.cuh hook_pass_layout)
_ALIGN = 256
# the automatic choice applies the pass once a request spans this many packed query rows (tokens x GQA group):
# below it a call's items read each key about once anyway
AUTO_MIN_ROWS = 64


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def workspace_bytes(variant, q, kv: PagedKV | RaggedKV, head_dim: int) -> int:
    """Bytes of the pass's workspace for this call (q [n, Hq, D], a 16-bit cache). A paged view's pages are
    copied packed, [2, page_size, Hkv, D] each (csrc/hook_pass.cuh hook_pass_packed_pages), whatever the pool's
    strides: vLLM's [2, P, ...] cache transposed or a pool of every layer's pages cost what their pages hold."""
    keys, queries = row_hooks(variant)
    elem = q.element_size()
    key_bytes = units = 0
    if keys and isinstance(kv, PagedKV):
        units = int(kv.indices.shape[0])
        key_bytes = units * 2 * kv.page_size * kv.num_kv_heads * head_dim * elem
    elif keys and int(kv.k.shape[0]) > 0:
        k = kv.k
        key_bytes = ((k.shape[0] - 1) * k.stride(0) + (k.shape[1] - 1) * k.stride(1) + head_dim) * elem
    query_bytes = int(q.shape[0]) * int(q.shape[1]) * head_dim * elem if queries else 0
    return _align(key_bytes) + _align(query_bytes) + units * 4


def check_choice(variant, choice) -> None:
    """plan_prefill's ``hook_pass``: None, True or False, and True only for a variant with a row hook."""
    if choice not in (None, True, False):
        raise AttentionArgumentError(f"hook_pass: expected None, True or False, got {choice!r}")
    if choice and not any(row_hooks(variant)):
        raise AttentionArgumentError(f"hook_pass: variant '{variant.name}' has no key or query transform to apply "
                                     "ahead; plan with hook_pass=None or False")


def workspace_for(variant, choice: bool | None, longest_rows: int, q, kv: PagedKV | RaggedKV, head_dim: int):
    """The workspace of a call (16-bit cache) that applies the pass (``wanted``), else None."""
    if not wanted(variant, choice, longest_rows):
        return None
    nbytes = workspace_bytes(variant, q, kv, head_dim)
    import torch

    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)


def wanted(variant, choice: bool | None, longest_rows: int) -> bool:
    """Whether a call applies the pass: ``choice`` True / False as planned, None (automatic) for variants
    with a key transform once a request spans at least AUTO_MIN_ROWS packed query rows (``longest_rows``)."""
    keys, queries = row_hooks(variant)
    if choice is not None:
        return choice and (keys or queries)
    return keys and longest_rows >= AUTO_MIN_ROWS
