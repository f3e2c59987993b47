"""Mixed precision for the training loop: `precision: fp32 | bf16 | fp16` of a sweep entry.

The forward pass (and the loss) runs under autocast in bf16 or fp16; the weights, the optimizer
and the gradients stay fp32 (autocast casts copies for its kernels), so what strategies
communicate is unchanged unless a gradient hook says otherwise. fp16's narrow range needs a
gradient scaler: the loss is scaled before backward, the optimizer steps on unscaled gradients,
and a step whose gradients overflowed is skipped (and logged) while the scale is lowered. Every
process that steps must make the same decision: true for single, dp and ddp (identical
gradients after all-reduce), and for fsdp through its sharded scaler; the parameter server
steps alone, so ps takes bf16, not fp16. FSDP also gathers 16-bit weights itself
(MixedPrecisionPolicy, pipeline/strategies/fsdp.py); the autocast here still runs around it.
"""

from __future__ import annotations

import logging
import typing

import torch

log = logging.getLogger("train")
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, name: str, device: torch.device, grad_scaler=None):
        """`grad_scaler(device)` builds fp16's scaler: the strategy's (Runtime.grad_scaler;
        FSDP agrees an overflow over its shards), torch's own by default."""
        self.name, self.device, self.dtype = name, device, DTYPES[name]
        make_scaler = grad_scaler or (lambda device: torch.amp.GradScaler(device.type))
        self.scaler = make_scaler(device) if name == "fp16" else None
        self.skipped_steps = 0

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None)

    @property
    def handles_overflow(self) -> bool:
        """A non-finite fp16 loss is the scaler's to skip, not a training error."""
        return self.scaler is not None

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """What the strategy steps: the optimizer itself, or, for fp16, one that unscales,
        skips an overflowed step and updates the scale."""
        # ScaledOptimizer stands in for the optimizer where it is stepped (step, zero_grad, the rest forwarded)
        return (
            optimizer if self.scaler is None else typing.cast(torch.optim.Optimizer, ScaledOptimizer(optimizer, self))
        )


class ScaledOptimizer:
    """The optimizer behind a gradient scaler; anything else is the optimizer's own."""

    def __init__(self, optimizer: torch.optim.Optimizer, precision: Precision):
        self._optimizer, self._precision = optimizer, precision

    def __getattr__(self, name):
        return getattr(self._optimizer, name)

    def step(self) -> None:
        scaler = self._precision.scaler
        assert scaler is not None  # made only where there is a scaler (optimizer() above)
        before = scaler.get_scale()
        scaler.step(self._optimizer)
        scaler.update()
        if scaler.get_scale() < before:  # the gradients overflowed: this step was skipped
            self._precision.skipped_steps += 1
            log.info("fp16: gradients overflowed, step skipped; loss scale %g -> %g", before, scaler.get_scale())
