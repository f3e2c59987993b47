"""Leaving a job: no process group is freed while the process runs (runtime/distributed.py's
destroy_process_group says why: freeing a gloo group under the GIL can deadlock)."""
from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pipeline.runtime import compat, distributed

from .test_strategies import free_port


def test_leaving_the_job_keeps_its_groups_after_the_model_wrapper_is_freed():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    group = weakref.ref(dist.group.WORLD)
    assert compat.process_groups() == [group()]  # the registry this torch has
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    model(torch.ones(2, 3)).sum().backward()
    distributed.destroy_process_group()
    assert not dist.is_initialized()  # torch forgot it ...
    del model  # ... and the reducer, its last user, is gone: as when a training function returns
    gc.collect()
    assert group() is not None  # still alive: freed only when the process ends
