"""The few collectives the checkpointer needs, over an optional process group (CPU tensors, gloo)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from phalanx.worker.checkpoint import payload
from phalanx.worker.devices import collective_device


@dataclass(frozen=True)
class Group:
    """A process group, or none at all (a single process): ranks here are group-local."""

    group: dist.ProcessGroup | None
    rank: int
    world_size: int
    distributed: bool

    @classmethod
    def resolve(cls, process_group: dist.ProcessGroup | None) -> Group:
        if process_group is None and not (dist.is_available() and dist.is_initialized()):
            return cls(None, 0, 1, False)
        return cls(
            process_group,
            dist.get_rank(process_group),
            dist.get_world_size(process_group),
            True,
        )

    def _device(self) -> torch.device:
        return collective_device(self.group)

    def all_gather_ints(self, values: list[int]) -> list[list[int]]:
        """Each rank's ``values`` (same length everywhere), indexed by rank."""
        if not self.distributed:
            return [list(values)]
        local = torch.tensor(values, dtype=torch.int64, device=self._device())
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local, group=self.group)
        return [tensor.tolist() for tensor in gathered]

    def broadcast_ints(self, values: list[int], src: int) -> list[int]:
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.int64, device=self._device())
        dist.broadcast(tensor, group=self.group, group_src=src)
        return tensor.tolist()

    def gather_objects(self, obj: object, dst: int = 0) -> list[object] | None:
        """Each rank's `obj` on `dst` (None elsewhere). Sent as payloads, not torch's pickled objects, so
        what arrives is read through the checkpoint allow-list (`payload.from_bytes`)."""
        if not self.distributed:
            return [obj]
        data = payload.to_bytes(obj)
        sizes = [size for (size,) in self.all_gather_ints([len(data)])]
        padded = torch.zeros(max(sizes), dtype=torch.uint8)
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        padded = padded.to(self._device())
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)] if self.rank == dst else None
        dist.gather(padded, gathered, group=self.group, group_dst=dst)
        if gathered is None:
            return None
        return [
            payload.from_bytes(tensor[:size].cpu().numpy().tobytes())
            for tensor, size in zip(gathered, sizes, strict=True)
        ]

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor, group=self.group, group_dst=dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        dist.recv(tensor, group=self.group, group_src=src)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)
