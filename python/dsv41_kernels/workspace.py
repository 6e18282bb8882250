"""Per-device workspaces: tensors a kernel keeps its state in from one launch to the next.

They are made on the first call, which must come before any CUDA-graph capture (memory made
during capture belongs to the graph's pool), and only the kernels change them afterwards.
Launches that share one must be stream-ordered: not from two streams of a device at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_made: dict[tuple[str, torch.device], tuple[torch.Tensor, ...]] = {}


def device_workspace(
    owner: str, device: torch.device, make: Callable[[torch.device], tuple[torch.Tensor, ...]]
) -> tuple[torch.Tensor, ...]:
    """``make(device)``'s tensors for ``owner`` on ``device``, made once."""
    key = (owner, device)
    workspace = _made.get(key)
    if workspace is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{owner}: its workspace is made on the first call, which must not be inside "
                f"CUDA-graph capture; call {owner} once before capturing"
            )
        workspace = _made[key] = make(device)
    return workspace
