"""What the runtime asks of a CUDA device's current stream (no host-to-device copy, no cached fill, while a CUDA
graph capture records it)."""
from __future__ import annotations


def stream_capturing(device) -> bool:
    """Whether the current stream of ``device`` (a CUDA device) is capturing a CUDA graph; False for another
    device."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()
