"""What makes every timed segment of one configuration do the same work (benchmarks/segments.py,
the GPU check's protocol): the batches of its first warm-up, kept as the loader gave them
(pinned, on the host: the loop copies each to the device as it trains), and the trained state
at that warm-up's end, restored before each segment. A detector's step costs what its
proposals, NMS and matchers find in the images, and a model that trains on finds other
proposals step by step: without both, two repeats of one configuration differ by their work,
not by the machine. Imported by segments.py from its own folder, so that it serves an older
revision's tree (--against) as it serves HEAD's.
"""

from __future__ import annotations

import hashlib
import random

import numpy
import torch


class Replay:
    """One config's kept batches and trained state (module docstring): what makes each of its
    segments do the same work. The state is every tensor that a step changes, copied on the
    device (parameters and buffers, whatever the strategy wraps them in; the optimizer's
    momentum and parameters, ZeRO's local optimizer's too), the step count (the learning rate's warm-up) and
    the random generators (the heads sample their training proposals at random); restored in
    place, so the strategy's own views of them stay valid."""

    def __init__(self, job):
        self.job = job
        self.batches: list = []
        self.playing = False
        self.position = 0
        self.consumed: list[int] = []  # which kept batches the current segment took, in order

    def keep(self, batch) -> None:
        self.batches.append(batch)

    def next(self):
        index = self.position % len(self.batches)
        self.position += 1
        self.consumed.append(index)
        return self.batches[index]

    def _tensors(self) -> list:
        """Every tensor a step changes, each once."""
        job = self.job
        optimizers = [o for o in (job.optimizer, getattr(job.optimizer, "optim", None)) if o is not None]
        candidates = [*job.model.parameters(), *job.model.buffers()]
        for optimizer in optimizers:
            # its own parameters too: a strategy may step copies of the model's (ps)
            candidates += [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]
            candidates += [value for state in getattr(optimizer, "state", {}).values() for value in state.values()]
        found = {id(t): t for t in candidates if torch.is_tensor(t)}
        return list(found.values())

    def freeze(self) -> None:
        """The state at the end of the loader's warm-up: the start of every segment."""
        if not self.batches:
            raise RuntimeError("replay: the warm-up kept no batch (give the protocol warm-up iterations)")
        self.tensors = self._tensors()
        self.saved = [t.detach().clone() for t in self.tensors]
        self.step = self.job.state.step
        self.generators = random_state()
        self.playing = True

    def restore(self) -> None:
        with torch.no_grad():
            for tensor, saved in zip(self.tensors, self.saved, strict=False):
                tensor.copy_(saved)
        self.job.state.step = self.step
        random_state(self.generators)
        self.position = 0
        self.consumed = []

    def digest(self) -> str:
        """What the current segment's timed iterations consumed: the kept batches' contents
        (images and targets, read now), in the order they were taken."""
        consumed, each = self.consumed, {}
        for index in set(consumed):
            h = hashlib.blake2b(digest_size=16)
            for tensor in flatten(self.batches[index]):
                if torch.is_tensor(tensor):
                    h.update(str((tensor.dtype, tuple(tensor.shape))).encode())
                    h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                else:
                    h.update(repr(tensor).encode())
            each[index] = h.hexdigest()
        return hashlib.blake2b("".join(each[i] for i in consumed).encode(), digest_size=8).hexdigest()


def random_state(restore: dict | None = None) -> dict:
    """torch's generators (host and devices), Python's and numpy's: read, or set to `restore`."""
    if restore is None:
        return {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": numpy.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
    torch.set_rng_state(restore["torch"])
    random.setstate(restore["python"])
    numpy.random.set_state(restore["numpy"])
    if restore["cuda"] is not None:
        torch.cuda.set_rng_state_all(restore["cuda"])
    return restore


def flatten(value):
    """The leaves of a batch (lists, tuples and dicts of tensors), in a fixed order."""
    if isinstance(value, dict):
        for key in sorted(value):
            yield key
            yield from flatten(value[key])
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from flatten(item)
    else:
        yield value
