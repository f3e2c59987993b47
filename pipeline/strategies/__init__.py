"""Data-parallel strategies. Each module says, for one way of training, three things:

* how processes start   (`launcher`: a plain process, or torchrun for one process per worker)
* how the model is wrapped (`wrap`)
* how gradients are synchronised and the weights updated (`step`)

    single.py  one process, one device: the reference
    dp.py      torch.nn.DataParallel: one process, GPU 0 scatters, gathers and updates
    ddp.py     DistributedDataParallel: ring all-reduce during backward, optional compression
    ps.py      parameter server over point-to-point messages, co-located or dedicated

The training loop in pipeline/train.py is the same for all of them.
"""
from __future__ import annotations

from .base import Context, Strategy, Traffic
from .ddp import DDP
from .dp import DataParallel
from .ps import ParameterServer
from .single import Single

STRATEGIES: dict[str, type[Strategy]] = {"single": Single, "dp": DataParallel, "ddp": DDP,
                                         "ps": ParameterServer}


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ValueError(f"sweep.strategy: unknown strategy {name!r}; "
                         f"choose one of {', '.join(STRATEGIES)}") from None


__all__ = ["Context", "Strategy", "STRATEGIES", "Traffic", "get"]
