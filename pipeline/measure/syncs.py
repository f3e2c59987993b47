"""Host-device synchronisations of a training step, counted on any machine.

On a GPU, an op whose output's shape depends on the data (nonzero, boolean-mask indexing,
unique, NMS's kept boxes, ...) makes the host wait for the device before it can go on, and so
does a read to the host (item, tolist, a tensor's truth value, cpu()). On a CPU nothing waits,
but the same ops run in the same places: counting them on a CPU says what would stall a GPU.
`SyncCounter` records each, per training step, with where it comes from: the first frame of
the Python stack outside torch itself (torchvision's detection heads, the project's code), as
`path:line (function)`.

The two kinds are seen in two places: the data-dependent ops at the dispatcher (a
TorchDispatchMode: they are called from C++ too, e.g. inside torchvision's NMS), the reads to
the host at the Python API (a TorchFunctionMode: Tensor.item, tolist, __bool__, cpu, ...), so
that item() counts once, not again as the aten._local_scalar_dense it becomes. A read of a
tensor that would live on the host on a GPU too (a list of image sizes made a tensor, then read)
is counted all the same: on a CPU the counter cannot tell, so its counts are an upper bound of
a GPU's; the GPU check sets them beside the profile's cudaStreamSynchronize.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# aten (and torchvision) ops whose output's size is known only once the data is: packet names
DATA_DEPENDENT = frozenset(
    {
        "nonzero",  # also torch.where(cond) with one argument
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "nms",  # torchvision's: the kept boxes
    }
)
# ops that are data-dependent only with some arguments (`_data_dependent`)
MASKED = frozenset({"index", "index_put", "index_put_"})  # with a boolean (or uint8) mask
# Tensor methods that read a value to the host
HOST_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "__array__"})
TORCH_DIR = str(Path(torch.__file__).parent) + "/"  # the slash: torchvision/ is not torch's
HERE = str(Path(__file__))


class Sync(NamedTuple):
    """One kind of synchronisation at one place: `kind` 'shape' (a data-dependent shape) or
    'read' (a value read to the host), the op, and where it was called from."""

    kind: str
    op: str
    where: str


def _where() -> str:
    """The first frame of the caller's stack outside torch and this module, as
    'torchvision/models/detection/rpn.py:262 (filter_proposals)'."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(TORCH_DIR) and name != HERE:
            return f"{_shown(name)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back  # type: ignore[assignment]
    return "torch"


def _shown(path: str) -> str:
    """A package's file from its package on (torchvision/ops/boxes.py), another relative to the
    working directory where it is under it."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _data_dependent(func, args, kwargs) -> bool:
    name = func.overloadpacket.__name__
    if name in DATA_DEPENDENT:
        return True
    if name == "repeat_interleave":  # repeats as a tensor, without the output's size
        return isinstance(args[0] if args else None, torch.Tensor) and kwargs.get("output_size") is None
    if name in MASKED:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in (indices or ())
            if i is not None
        )
    return False


class _Shapes(TorchDispatchMode):
    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _data_dependent(func, args, kwargs):
            self.counter.add(Sync("shape", func.overloadpacket.__name__, _where()))
        return func(*args, **kwargs)


class _Reads(TorchFunctionMode):
    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS and args and isinstance(args[0], torch.Tensor):
            self.counter.add(Sync("read", name, _where()))
        return func(*args, **(kwargs or {}))


@dataclass
class SyncCounter:
    """Counts synchronisations while entered, a Counter per step (`step()` closes one)::

    counter = SyncCounter()
    with counter:
        for batch in batches:
            train_step(batch)
            counter.step()
    counter.steps[-1].most_common()
    """

    steps: list[Counter[Sync]] = field(default_factory=list)
    current: Counter[Sync] = field(default_factory=Counter)

    def add(self, sync: Sync) -> None:
        self.current[sync] += 1

    def step(self) -> Counter[Sync]:
        """Close this step's count and start the next; returns the closed one."""
        done, self.current = self.current, Counter()
        self.steps.append(done)
        return done

    def __enter__(self) -> SyncCounter:
        self._modes = (_Reads(self), _Shapes(self))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def by_source(count: Counter[Sync]) -> Counter[tuple[str, str]]:
    """A step's count per (kind, where), every op at one place together."""
    found: Counter[tuple[str, str]] = Counter()
    for sync, n in count.items():
        found[sync.kind, sync.where] += n
    return found


def by_op(count: Counter[Sync]) -> Counter[str]:
    """A step's count per op ('nonzero', 'item', ...)."""
    found: Counter[str] = Counter()
    for sync, n in count.items():
        found[sync.op] += n
    return found
