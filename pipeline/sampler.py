"""Batches for one training process: shuffled per epoch from (seed, epoch) alone, so a resumed
run sees exactly the batches an uninterrupted one would; sharded by rank; optionally grouped
by aspect ratio (torchvision's recipe) so a batch pads little."""
from __future__ import annotations

import bisect
import math

import torch


def aspect_ratio_groups(ratios: list[float], k: int) -> list[int]:
    """Group id per image: k log-spaced bins each side of 1, as references/detection does."""
    if k <= 0:
        return [0] * len(ratios)
    edges = (2 ** torch.linspace(-1, 1, 2 * k + 1)).tolist()
    return [bisect.bisect_right(edges, r) for r in ratios]


class ShardedBatchSampler(torch.utils.data.Sampler):
    """Every rank gets the same number of batches (padding by wrapping around, as
    DistributedSampler does), so no rank waits for a batch that never comes."""

    def __init__(self, size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                 group_ids: list[int] | None = None):
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.group_ids = group_ids or [0] * size
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """The epoch's batches from the `skip`-th on: a run resumed mid-epoch goes on there."""
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        per_rank = math.ceil(self.size / self.world_size)
        return math.ceil(per_rank / self.batch_size)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        per_rank = math.ceil(self.size / self.world_size)
        order = (order * math.ceil(per_rank * self.world_size / self.size))[:per_rank * self.world_size]
        shard = order[self.rank::self.world_size]
        batches, pending = [], {}
        for index in shard:  # fill one buffer per group; a full buffer is a batch
            buffer = pending.setdefault(self.group_ids[index], [])
            buffer.append(index)
            if len(buffer) == self.batch_size:
                batches.append(buffer)
                pending[self.group_ids[index]] = []
        leftovers = [i for group in sorted(pending) for i in pending[group]]
        batches += [leftovers[i:i + self.batch_size] for i in range(0, len(leftovers), self.batch_size)]
        # Mixed leftovers can make one more batch than __len__ promises; merge the tail so
        # every rank yields exactly len(self) batches.
        while len(batches) > len(self):
            tail = batches.pop()
            batches[-1] = batches[-1] + tail
        return iter(batches[self.skip:])
