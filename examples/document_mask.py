"""Packed documents: several documents share one request's token row, each attending causally to itself
only. The document id of every position comes in a tensor parameter [batch_size, max_len], so one build
serves any packing."""
import numpy as np
from tvm.script import tirx as T

from attngen import TensorParam, Variant


@T.prim_func
def document_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                  doc_ptr: T.handle) -> T.bool:
    nbatch = T.int32()
    max_len = T.int32()
    doc_ids = T.match_buffer(doc_ptr, (nbatch, max_len), "int32")
    return kv_pos <= qo_pos and doc_ids[batch, kv_pos] == doc_ids[batch, qo_pos]


variant = Variant(
    "document_mask",
    logits_mask=document_mask,
    # the positions a request reads lie below its length: the caller sizes max_len (at least 1 here; a
    # shorter row than a request's length is the caller's error, as for any packed layout)
    params=[TensorParam("doc_ids", "int32", ("batch_size", "max_len>=1"), "document of each position")],
    doc="causal attention inside each packed document",
)


def packed_documents(variant, rng, problem) -> dict:
    """Each request's row cut into 1-3 documents at random boundaries."""
    width = max(max(problem.kv_lens, default=1), 1)
    ids = np.zeros((len(problem.kv_lens), width), np.int32)
    for b, n in enumerate(problem.kv_lens):
        cuts = np.sort(rng.integers(0, n + 1, size=2))
        ids[b, cuts[0]:] += 1
        ids[b, cuts[1]:] += 1
    return {"doc_ids": ids}


def main(head_dim: int = 64, **kwargs):
    from attngen.testing import run_cpu_example

    return run_cpu_example(variant, head_dim=head_dim, make_params=packed_documents, **kwargs)


if __name__ == "__main__":
    main()
