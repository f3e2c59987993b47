"""Batches for one training process: shuffled per epoch from (seed, epoch) alone, so a resumed
run sees exactly the batches an uninterrupted one would; sharded by rank; full batches only;
optionally grouped by aspect ratio (torchvision's recipe) so a batch pads little."""

from __future__ import annotations

import bisect
import itertools
import math

import torch


def aspect_ratio_groups(ratios: list[float], k: int) -> list[int]:
    """Group id per image: k log-spaced bins each side of 1, as references/detection does."""
    if k <= 0:
        return [0] * len(ratios)
    edges = (2 ** torch.linspace(-1, 1, 2 * k + 1)).tolist()
    return [bisect.bisect_right(edges, r) for r in ratios]


class ShardedBatchSampler(torch.utils.data.Sampler):
    """Full batches only, as torchvision's reference trainer takes them (its BatchSampler with
    drop_last=True, or its GroupedBatchSampler): an epoch's short last batch would otherwise be
    a step on a few images at the full learning rate. Every rank gets the same number of
    batches (its shard padded by wrapping around, as DistributedSampler does), so no rank waits
    for a batch that never comes."""

    def __init__(
        self,
        size: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        group_ids: list[int] | None = None,
    ):
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.group_ids = group_ids or [0] * size
        self.epoch, self.skip = 0, 0
        if len(self) == 0:
            raise ValueError(
                f"{size} training images over {world_size} process(es) give each {self.per_rank}, "
                f"fewer than one batch of {batch_size}: lower images_per_worker or use more images"
            )

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """The epoch's batches from the `skip`-th on: a run resumed mid-epoch goes on there."""
        self.epoch, self.skip = epoch, skip

    @property
    def per_rank(self) -> int:
        return math.ceil(self.size / self.world_size)

    def __len__(self) -> int:
        return self.per_rank // self.batch_size

    def __iter__(self):
        # Seeded from (seed, epoch) alone, like DistributedSampler's seed + epoch: the reference
        # seeds its single-process RandomSampler once instead, which a resumed run could not
        # replay. Either way each epoch is a uniformly random permutation.
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        order = (order * math.ceil(self.per_rank * self.world_size / self.size))[: self.per_rank * self.world_size]
        shard = order[self.rank :: self.world_size]
        batches, pending, members = [], {}, {}
        for index in shard:  # fill one buffer per group; a full buffer is a batch
            group = self.group_ids[index]
            members.setdefault(group, []).append(index)
            buffer = pending.setdefault(group, [])
            buffer.append(index)
            if len(buffer) == self.batch_size:
                batches.append(buffer)
                pending[group] = []
        # Too few full batches (the groups' leftovers): complete the fullest leftovers with
        # more images of their own group, as the reference's GroupedBatchSampler does, so a
        # batch never mixes aspect ratios and every rank yields exactly len(self) batches.
        for group in sorted(pending, key=lambda g: len(pending[g]), reverse=True):
            if len(batches) == len(self):
                break
            if pending[group]:
                missing = self.batch_size - len(pending[group])
                batches.append(pending[group] + list(itertools.islice(itertools.cycle(members[group]), missing)))
        return iter(batches[self.skip : len(self)])
