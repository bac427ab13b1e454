"""Elastic data order: a world-size-independent sample order with a global cursor.

The order of an epoch is a permutation seeded by (seed, epoch). Training consumes it in global batches of
a fixed size; the cursor counts samples consumed in the epoch by the whole group, so it does not depend on
how many ranks there are. Each rank takes its share of every global batch; after a world-size change the
rest of the epoch is simply shared among the new ranks, so no sample is skipped or repeated.

Since the global batch stays constant, ranks may hold different numbers of samples (and micro-batches);
`micro_batches` gives each micro-batch the loss scale that makes DDP's averaged gradient equal the gradient
of the mean loss over the full global batch, whatever the world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MicroBatch:
    """Sample indices for one forward/backward of this rank."""

    indices: list[int]
    loss_scale: float
    """Multiply this micro-batch's *mean* loss by it before backward."""
    sync: bool
    """True for the rank's last micro-batch: its backward all-reduces (use DDP's no_sync() otherwise)."""


def rank_share(batch: list[int], rank: int, world_size: int) -> list[int]:
    """Contiguous share of a global batch: the first `len % world` ranks get one extra sample."""
    base, extra = divmod(len(batch), world_size)
    start = rank * base + min(rank, extra)
    return batch[start : start + base + (1 if rank < extra else 0)]


def micro_batches(
    indices: list[int], max_micro_batch: int, world_size: int, global_batch_size: int
) -> list[MicroBatch]:
    """Split one rank's share into micro-batches with loss scales for gradient accumulation.

    DDP averages gradients over ranks (divides by world size), so a micro-batch of m samples whose mean
    loss is scaled by m * world_size / global_batch_size contributes exactly its samples' share of the
    full-batch mean.
    """
    if max_micro_batch < 1:
        raise ValueError("max_micro_batch must be at least 1")
    chunks = [indices[i : i + max_micro_batch] for i in range(0, len(indices), max_micro_batch)]
    return [
        MicroBatch(
            indices=chunk,
            loss_scale=len(chunk) * world_size / global_batch_size,
            sync=position == len(chunks) - 1,
        )
        for position, chunk in enumerate(chunks)
    ]


class ElasticSampler:
    """Deterministic global sample order with a cursor that survives world-size changes.

    Usage per step: `batch = sampler.next_global_batch()`, then `rank_share(batch, rank, world)`.
    The final incomplete batch of an epoch is dropped, the same at every world size.
    """

    def __init__(self, dataset_len: int, global_batch_size: int, seed: int = 0) -> None:
        if global_batch_size < 1 or dataset_len < global_batch_size:
            raise ValueError(
                f"need 1 <= global_batch_size ({global_batch_size}) <= dataset_len ({dataset_len})"
            )
        self.dataset_len = dataset_len
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self.bad_batches: set[tuple[int, int]] = set()
        """Positions (epoch, cursor) of global batches to skip: ones that produced a non-finite loss."""
        self._order_epoch = -1
        self._order: list[int] = []
        self._last_position: tuple[int, int] | None = None

    @property
    def batches_per_epoch(self) -> int:
        return self.dataset_len // self.global_batch_size

    def order(self, epoch: int) -> list[int]:
        """The epoch's sample order (cached for the current epoch)."""
        if epoch != self._order_epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = torch.randperm(self.dataset_len, generator=generator).tolist()
            self._order_epoch = epoch
        return self._order

    def _next_position(self, epoch: int, cursor: int) -> tuple[int, int]:
        """Where the next global batch starts, past the epoch's end and past bad batches."""
        while True:
            if cursor + self.global_batch_size > self.dataset_len:
                epoch, cursor = epoch + 1, 0
            if (epoch, cursor) not in self.bad_batches:
                return epoch, cursor
            cursor += self.global_batch_size

    def peek_global_batch(self) -> list[int]:
        """The next global batch, without consuming it."""
        epoch, cursor = self._next_position(self.epoch, self.cursor)
        return self.order(epoch)[cursor : cursor + self.global_batch_size]

    def next_global_batch(self) -> list[int]:
        """Consume and return the next global batch (same on every rank)."""
        self.epoch, self.cursor = self._next_position(self.epoch, self.cursor)
        self._last_position = (self.epoch, self.cursor)
        batch = self.order(self.epoch)[self.cursor : self.cursor + self.global_batch_size]
        self.cursor += self.global_batch_size
        return batch

    def skip_batches(self, count: int) -> list[tuple[int, int]]:
        """Pass over the next `count` global batches without serving them (after a rollback: the batches
        that led to the anomaly); returns their positions (epoch, cursor)."""
        skipped: list[tuple[int, int]] = []
        for _ in range(max(count, 0)):
            self.epoch, self.cursor = self._next_position(self.epoch, self.cursor)
            skipped.append((self.epoch, self.cursor))
            self.cursor += self.global_batch_size
        return skipped

    def mark_last_batch_bad(self) -> tuple[int, int]:
        """Never serve the batch just consumed again (it will be skipped after a rollback)."""
        if self._last_position is None:
            raise RuntimeError("no batch consumed yet")
        self.bad_batches.add(self._last_position)
        return self._last_position

    def next_rank_batch(self, rank: int, world_size: int) -> list[int]:
        return rank_share(self.next_global_batch(), rank, world_size)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "seed": self.seed,
            "dataset_len": self.dataset_len,
            "global_batch_size": self.global_batch_size,
            "bad_batches": sorted([list(position) for position in self.bad_batches]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "dataset_len", "global_batch_size"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(f"sampler {key} changed: checkpoint {state[key]}, now {getattr(self, key)}")
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self.bad_batches = {(int(epoch), int(cursor)) for epoch, cursor in state.get("bad_batches", [])}
