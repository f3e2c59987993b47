"""One spelling per torch release: the pipeline's calls that differ between the lock's torch and
the older torch a GPU host brings."""
from __future__ import annotations

import inspect

from torch.nn.parallel import DistributedDataParallel

from pipeline.runtime import compat


def test_ddp_buffer_sync_uses_the_keyword_this_torch_has():
    (name, value), = compat.ddp_buffer_sync(True).items()
    assert value is True and name in inspect.signature(DistributedDataParallel.__init__).parameters
    assert compat.ddp_buffer_sync(False) == {name: False}


def test_ddp_buffer_sync_on_a_torch_before_the_rename():
    class OlderDDP:  # DistributedDataParallel's signature in torch 2.11 and before
        def __init__(self, module, device_ids=None, broadcast_buffers=True, process_group=None):
            pass

    assert compat.ddp_buffer_sync(True, OlderDDP) == {"broadcast_buffers": True}
