"""attngen.runtime: calling built kernels (CPU backend here), KV views, references, mask packing."""
from .append import append_paged_kv, append_slots
from .block_sparse import BlockSparseAttention, HeadwiseBlockSparseView
from .cascade import CascadeAttention, CascadeLevel
from .checks import AttentionArgumentError
from .cpu import CPUAttention
from .cuda import CUDAAttention, DecodePlan
from .custom_mask import pack_custom_mask
from .reference import gather_pages, reference_attention
from .single import single_decode, single_prefill
from .state import merge_state, merge_states, merge_states_sum
from .views import BlockSparseView, PagedKV, RaggedKV

__all__ = ["AttentionArgumentError", "BlockSparseAttention", "BlockSparseView", "CascadeAttention", "CascadeLevel",
           "CPUAttention", "CUDAAttention", "DecodePlan", "HeadwiseBlockSparseView", "PagedKV", "RaggedKV",
           "append_paged_kv", "append_slots", "gather_pages", "merge_state", "merge_states", "merge_states_sum",
           "pack_custom_mask", "reference_attention", "single_decode", "single_prefill"]
