"""Vanilla softmax attention: no hooks at all."""
from attngen.ir import Variant


def make() -> Variant:
    return Variant("vanilla", doc="softmax(q k^T * sm_scale) v")
