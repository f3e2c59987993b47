"""Knobs that change how fast a step runs, not what it computes (within the precision's
rounding; tests/test_speed.py checks one step's losses and gradients with each on and off).
Each defaults to the loop as it was; the GPU check's `knobs` item times each beside the default
in one sitting (benchmarks/gpu_check.py). Why these, for a detector whose GPU idles while the
host launches its kernels (SM 49 % at 16 images in bf16 on an H100):

  train.channels_last   NHWC convolutions (tensor cores take NHWC without transposes)
  train.compile         `backbone`: torch.compile of the backbone and FPN (inductor, automatic
                        dynamic shapes: compiled for the first size, made dynamic if the size
                        changes). The frozen BatchNorms, ReLUs and residual adds of R50 fuse
                        into the convolutions' neighbours: fewer kernels, fewer launches. The
                        heads stay eager (their sizes depend on the data: proposals, matches).
  train.optimizer       `foreach` or `fused` SGD: one multi-tensor kernel per group of
                        parameters, or one fused kernel, instead of torch's default choice;
                        `default` leaves it to torch (foreach on CUDA, per tensor on CPU).

A compile failure ends the run with one line naming train.compile and the remedy (`compiled`).
"""

from __future__ import annotations

import logging
import typing

import torch

from ..config import schema

log = logging.getLogger("train")
COMPILE = ("backbone",)  # train.compile: false, or what is compiled
OPTIMIZERS = ("default", "foreach", "fused")


class CompileFailed(RuntimeError):
    """torch.compile could not compile (or run) the backbone: one line, and the remedy."""

    def __init__(self, err: BaseException):
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        super().__init__(
            f"train.compile: torch.compile of the backbone failed ({type(err).__name__}: "
            f"{first}); set train.compile: false to train uncompiled"
        )


def is_compile_error(err: BaseException) -> bool:
    """An error of torch.compile's own (dynamo, AOT autograd, inductor): named by its module, so
    that the loop imports none of them to tell."""
    return type(err).__module__.startswith(("torch._dynamo", "torch._inductor", "torch._functorch"))


def apply(model: torch.nn.Module, train: schema.Train) -> torch.nn.Module:
    """The model laid out and compiled as train.channels_last and train.compile say, before the
    strategy wraps it (its parameters and state dict keep their names: the backbone is compiled
    in place)."""
    if train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if train.compile:
        # In place (nn.Module.compile): no `_orig_mod.` in the names that checkpoints, FSDP's
        # units and the equivalence check read.
        typing.cast(torch.nn.Module, model.backbone).compile(dynamic=None)
        log.info("train.compile: the backbone compiles on its first iterations")
    return model


def sgd_options(train: schema.Train) -> dict:
    """train.optimizer as SGD's keywords: {} leaves the implementation to torch."""
    choice = train.optimizer
    return {} if choice == "default" else {choice: True}
