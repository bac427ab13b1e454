"""Where a collective's tensors must live: decided by the backends a process group has, never by a name.

torch's default group (`init_process_group()` with no backend) is "undefined" by name and holds gloo for host
tensors beside NCCL for CUDA ones; `"cpu:gloo,cuda:nccl"` holds both by name; `"nccl"` alone takes only CUDA
tensors. A rule on `get_backend() == "nccl"` gets the first two wrong. The group itself says which device types
its backends take (`ProcessGroup._device_types`, what torch's own object collectives ask).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def device_types(group: Any) -> list[str]:
    """The device types the backends of `group` take (`ProcessGroup._device_types`); [] when it does not say."""
    return [device.type for device in getattr(group, "_device_types", None) or []]


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device for a small collective's tensors on `group` (None: the default group): the host when a
    backend of the group takes host tensors, as copying a few bytes to a GPU and back would cost more than
    the collective; else this process's current accelerator (NCCL alone)."""
    kinds = device_types(group if group is not None else dist.group.WORLD)
    if not kinds or "cpu" in kinds:
        return torch.device("cpu")
    kind = kinds[0]
    accelerator = getattr(torch, kind, None)
    current = getattr(accelerator, "current_device", None)
    return torch.device(kind, current()) if callable(current) else torch.device(kind)
