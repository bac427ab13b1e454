"""ElasticSampler: no sample skipped or repeated across world-size changes; constant-batch gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phalanx.worker.data import ElasticSampler, micro_batches, rank_share


def consume(sampler: ElasticSampler, world_size: int, steps: int) -> list[int]:
    """Every rank draws its share of `steps` global batches (each rank has its own sampler copy)."""
    ranks = []
    for _ in range(world_size):
        replica = ElasticSampler(sampler.dataset_len, sampler.global_batch_size, sampler.seed)
        replica.load_state_dict(sampler.state_dict())
        ranks.append(replica)
    seen: list[int] = []
    for _ in range(steps):
        for rank, replica in enumerate(ranks):
            seen.extend(replica.next_rank_batch(rank, world_size))
    assert len({replica.cursor for replica in ranks}) == 1
    sampler.load_state_dict(ranks[0].state_dict())
    return seen


def test_world_size_changes_4_3_5_within_an_epoch_skip_and_repeat_nothing() -> None:
    sampler = ElasticSampler(dataset_len=120, global_batch_size=12, seed=7)
    seen = consume(sampler, 4, 3) + consume(sampler, 3, 4) + consume(sampler, 5, 3)
    assert sampler.epoch == 0 and sampler.cursor == 120
    assert sorted(seen) == list(range(120))
    assert seen == sampler.order(0), "the global order does not depend on the world size"


def test_epochs_reshuffle_and_drop_only_the_incomplete_tail() -> None:
    sampler = ElasticSampler(dataset_len=25, global_batch_size=8, seed=1)
    first = [sampler.next_global_batch() for _ in range(3)]
    second = sampler.next_global_batch()
    assert sampler.epoch == 1
    assert len({index for batch in first for index in batch}) == 24
    assert second == sampler.order(1)[:8] and sampler.order(1) != sampler.order(0)


def test_bad_batches_are_skipped_after_a_rollback() -> None:
    sampler = ElasticSampler(dataset_len=40, global_batch_size=4, seed=0)
    sampler.next_global_batch()
    saved = sampler.state_dict()
    bad = sampler.next_global_batch()
    sampler.mark_last_batch_bad()
    marks = set(sampler.bad_batches)
    sampler.load_state_dict(saved)
    sampler.bad_batches |= marks
    assert sampler.next_global_batch() == sampler.order(0)[8:12] != bad
    restored = ElasticSampler(40, 4, 0)
    restored.load_state_dict(sampler.state_dict())
    assert restored.bad_batches == marks


def test_uneven_shares_cover_the_batch() -> None:
    batch = list(range(10))
    shares = [rank_share(batch, rank, 3) for rank in range(3)]
    assert [len(share) for share in shares] == [4, 3, 3]
    assert [index for share in shares for index in share] == batch


def full_batch_gradient(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    nn.functional.mse_loss(model(inputs), targets).backward()
    return torch.cat([parameter.grad.flatten() for parameter in model.parameters()])


def ddp_gradient(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, world_size: int, micro: int
) -> torch.Tensor:
    """What DDP computes: each rank accumulates its scaled micro-batches, then the ranks' grads are averaged."""
    batch = list(range(len(inputs)))
    per_rank = []
    for rank in range(world_size):
        model.zero_grad()
        for part in micro_batches(rank_share(batch, rank, world_size), micro, world_size, len(batch)):
            index = torch.tensor(part.indices)
            loss = nn.functional.mse_loss(model(inputs[index]), targets[index])
            (loss * part.loss_scale).backward()
        per_rank.append(torch.cat([parameter.grad.flatten() for parameter in model.parameters()]))
    return torch.stack(per_rank).mean(0)


@pytest.mark.parametrize(("world_size", "micro"), [(1, 7), (2, 4), (3, 2), (5, 1)])
def test_scaled_micro_batches_give_the_full_batch_gradient(world_size: int, micro: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    inputs, targets = torch.randn(7, 3, dtype=torch.double), torch.randn(7, 2, dtype=torch.double)
    expected = full_batch_gradient(model, inputs, targets)
    torch.testing.assert_close(ddp_gradient(model, inputs, targets, world_size, micro), expected)


def test_only_the_last_micro_batch_syncs() -> None:
    parts = micro_batches(list(range(5)), 2, world_size=2, global_batch_size=10)
    assert [part.sync for part in parts] == [False, False, True]
    assert [part.loss_scale for part in parts] == [0.4, 0.4, 0.2]
