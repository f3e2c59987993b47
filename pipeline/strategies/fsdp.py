"""`fsdp`: fully sharded data parallel, FSDP2 (`fully_shard`), one process per worker by torchrun.

Every parameter, its gradient and its momentum are split over the N ranks (dim 0 of each
tensor, 1/N each): no rank holds the whole model between steps. The detector is sharded in
the units it declares (pipeline/detection/model.py `fsdp_units`), each gathered only while it
computes:
  * each stage of the backbone's body that trains (ResNet-50's layer2-4 as coco2017 freezes
    conv1 and layer1; the tiny backbone's six conv blocks);
  * the FPN, the RPN head and the ROI heads (box head and predictor): each runs as one block;
  * the root: what is left (the stem, frozen layers, the transform), gathered for the whole
    forward and, as FSDP2 advises for the root, kept gathered into the backward.
Forward: each unit all-gathers its weights before it runs. Backward: with
`reshard_after_forward: true` (ZeRO-3) each unit gathers them again, then reduce-scatters its
gradients, so each rank keeps the averaged 1/N it owns; with `false` (ZeRO-2-like) the weights
stay gathered between forward and backward: less traffic, more memory. Each rank then steps its
own shard (the optimizer sees only sharded tensors). Per rank: 3(N-1)/N M (reshard) or
2(N-1)/N M (keep) each way, M the gradient bytes.

bf16 and fp16 runs use FSDP2's MixedPrecisionPolicy: each unit gathers its weights in 16 bits
(half the all-gather bytes) and computes with them, reduce-scatters its gradients in fp32 into
the fp32 shards the optimizer steps. BatchNorm layers keep fp32 weights (their running
statistics are fp32 buffers, and batch_norm refuses bf16 weights beside fp32 statistics): the
BatchNorm layers of each unit form one companion unit, gathered in fp32 alongside it. The policy
casts the parameters, not the tensors the detector builds itself (anchors, proposals, RoIAlign's
boxes, FrozenBatchNorm's buffers): the loop's one autocast still runs around the forward to make
those operations agree with 16-bit weights, as it does for every strategy (measured on CPU
without it: "nms_kernel not implemented for 'BFloat16'", "Input type (torch.FloatTensor) and
weight type (CPUBFloat16Type) should be the same"). fp16's loss scaler is torch's
ShardedGradScaler: each rank sees only its shards' gradients, so whether a step overflowed is
agreed over all ranks before any of them steps.
Checkpoints hold the gathered full state dicts (torch.distributed.checkpoint.state_dict's
full_state_dict), written by rank 0 and read by every rank, so a checkpoint is a plain model and
a plain optimizer state keyed by parameter name, whatever the world size.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..config import schema
from ..costmodel.collectives import Collective, Phase
from ..runtime import compat
from ..runtime.run import Run
from .base import Option
from .process import Context, tensor_checksum
from .torchrun import TorchrunRuntime, TorchrunStrategy

if TYPE_CHECKING:  # the spec stays torch-free at run time
    import torch

GATHERED_BYTES = {"bf16": 2, "fp16": 2}  # per element of a 16-bit run's weights, all-gathered


def batchnorms(module) -> list:
    import torch

    return [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def shard_units(model) -> list:
    """The blocks sharded one by one: those the model declares by name (`fsdp_units`: the
    detector's, pipeline/detection/model.py); of a model that declares none (a test's), its
    children that train."""
    declared = getattr(model, "fsdp_units", None)
    if declared is None:
        return [m for m in model.children() if any(p.requires_grad for p in m.parameters())]
    return [model.get_submodule(name) for name in declared]


class Gathered:
    """A model's or optimizer's state as a checkpoint sees it: the full state dict gathered by
    `FSDPRuntime.consolidate` (read on rank 0), loaded by every rank back into its shards."""

    def __init__(self, strategy: FSDPRuntime, part: str, model, optimizer):
        self.strategy, self.part, self.model, self.optimizer = strategy, part, model, optimizer

    def state_dict(self) -> dict:
        return self.strategy.gathered[self.part]

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint import state_dict as state_dict_api

        options = state_dict_api.StateDictOptions(full_state_dict=True)
        if self.part == "model":
            state_dict_api.set_model_state_dict(self.model, state, options=options)
        else:
            state_dict_api.set_optimizer_state_dict(self.model, self.optimizer, state, options=options)


class UnitBytes(NamedTuple):
    """What a rank sends (and receives) for one FSDP unit, from its shard sizes."""

    gathered: int  # when its weights are all-gathered (forward; backward if resharded)
    reduced: int  # when its gradients are reduce-scattered
    probe: tuple | None  # (module, name) of a parameter of its own: FSDP2 registers a DTensor
    #                       there while the unit is sharded, a plain tensor while it is gathered
    has_gradients: bool


class FSDP(TorchrunStrategy):
    name = "fsdp"
    label = "FSDP2"
    options = {
        "reshard_after_forward": Option(
            True,
            {"type": "boolean"},
            "true: ZeRO-3, weights gathered again for the backward; false: kept gathered (ZeRO-2-like)",
        )
    }
    evaluates_on_workers = False  # model_final.pt is the whole model: one process scores it
    equivalence_entry = {"workers": 2, "images_per_worker": 4}
    theory_text = (
        "3(N-1)/N M per rank for FSDP with resharding after forward (all-gather in "
        "forward and again in backward, reduce-scatter of the gradients) and "
        "2(N-1)/N M without"
    )
    memory_text = (
        "1/N of the weights, gradients and momentum (3M/N), and while a block computes, "
        "its whole weights (and gradients in the backward): at most the largest block"
    )
    communication_timed = None  # each unit's gathers and reduce-scatters run in its passes
    bytes_counted = (
        "FSDP's are the bytes of each unit's shards as a ring all-gather or "
        "reduce-scatter moves them, counted when each unit gathers its weights "
        "(seen sharded as it starts its forward, or resharded after it) and when "
        "it reduces its gradients."
    )

    @classmethod
    def predicted_curves(cls, predict: schema.Predict) -> dict[str, dict]:
        return {
            "FSDP (ZeRO-3, reshard)": {"strategy": cls.name, "reshard_after_forward": True},
            "FSDP (keep gathered)": {"strategy": cls.name, "reshard_after_forward": False},
        }

    @classmethod
    def variant(cls, run: Run) -> str:
        return "" if run.option("reshard_after_forward") else "keep"

    def unavailable(self) -> str | None:
        if self.parallel.sync_batchnorm:
            return "sync_batchnorm is implemented for ddp only"
        return super().unavailable()

    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> Sequence[Phase]:
        """Ring all-gathers of the weights in forward (and again in backward when resharding),
        and a ring reduce-scatter of the gradients: (N-1)/N M per rank each, in N-1 steps; a
        16-bit run gathers 16-bit weights (M/2; BatchNorm's few fp32 weights counted so too)."""
        n = run.workers
        if n < 2:
            return []
        gathered = Collective("all_gather", n, grad_bytes * GATHERED_BYTES.get(run.precision, 4) / 4)
        return [gathered] * (2 if run.option("reshard_after_forward") else 1) + [
            Collective("reduce_scatter", n, grad_bytes)
        ]

    @classmethod
    def calibrate(cls, timed) -> dict[str, float]:
        """The detector's forward + backward as it is (`plain_s`) and as its runtime shards it,
        resharding after forward (`reshard_s`) and keeping the weights gathered (`keep_s`):
        FSDP2's cost on this machine, its gathers and reduce-scatters with what it does around
        them (copies in and out of its buffers, hooks), which on CPU processes is most of it
        (measured on 2: 42-54 ms an iteration resharding, 26-50 keeping, for the tiny detector's
        9 units, where gloo's all-gather of a small message takes 0.65 ms). In fp32; it hardly
        depends on the images (the same within the timing noise at 2, 4 and 8 a process)."""
        found = {"plain_s": timed(None)}
        for reshard, key in ((True, "reshard_s"), (False, "keep_s")):
            # no launcher settings: wrapping reads none of them
            runtime = cls(
                cls.filled(workers=1, reshard_after_forward=reshard), typing.cast(schema.Parallel, {})
            ).runtime()
            found[key] = timed(lambda model: runtime.wrap(model, Context()))  # noqa: B023 (called here)
        return found

    @classmethod
    def communication_seconds(cls, run: Run, grad_bytes: float, network, backward: float) -> float:
        """Where commbench timed FSDP2 on the run's model at its process count
        (`network.calibrations`, `calibrate`), what it added to forward + backward: FSDP2's
        gathers and reduce-scatters run inside them, and on a CPU most of their cost is FSDP2's
        own work around them, which no link model of its rings sees. Otherwise (and for a
        16-bit run, as the timing is fp32's), the rings of `phases` one after the other."""
        timed = (network.calibrations or {}).get(cls.name)
        if run.workers < 2 or not timed or run.precision != "fp32":
            return super().communication_seconds(run, grad_bytes, network, backward)
        setting = "reshard_s" if run.option("reshard_after_forward") else "keep_s"
        return max(0.0, timed[setting] - timed["plain_s"])

    @classmethod
    def memory_theory(cls, run: Run, grad_bytes: float) -> dict[str, float]:
        n = run.workers
        return {"parameters": grad_bytes / n, "gradients": grad_bytes / n, "optimizer": grad_bytes / n}

    def runtime(self) -> FSDPRuntime:
        return FSDPRuntime(self)


class FSDPRuntime(TorchrunRuntime):
    """A rank: the model sharded in its units, each unit's collectives counted as they run."""

    def __init__(self, spec: FSDP):
        super().__init__(spec)
        self.gathered: dict = {}
        self.units: list = []
        # the model's structure on the meta device, to score a gathered copy
        self._blueprint: torch.nn.Module | None = None

    def wrap(self, model, ctx: Context):
        self._blueprint = copy.deepcopy(model).to("meta")
        fully_shard = compat.fully_shard()
        reshard = self.run.option("reshard_after_forward")
        low, full = self._policies()
        self.units = shard_units(model)
        for unit in self.units:
            if low is not None and batchnorms(unit):  # fp32 companion, in step with its unit
                fully_shard(batchnorms(unit), reshard_after_forward=reshard, mp_policy=full)
            fully_shard(unit, reshard_after_forward=reshard, **self._policy(low))
            unit.register_forward_pre_hook(self._count_gather, prepend=True)
            unit.register_forward_hook(self._count_regather)
        if low is not None:
            rest = [m for m in batchnorms(model) if not any(m in batchnorms(u) for u in self.units)]
            if rest:
                fully_shard(rest, reshard_after_forward=False, mp_policy=full)
            self._fp32 = {id(p) for m in batchnorms(model) for p in m.parameters()}
        fully_shard(model, **self._policy(low))  # the root: kept gathered for the backward
        model.register_forward_pre_hook(self._count_gather, prepend=True)
        self.units.append(model)
        # Shards never change size: each unit's bytes are counted once, here, and an iteration
        # only adds them up (no walk over parameters, nothing read from the device).
        self._bytes = {id(unit): self._unit_bytes(unit) for unit in self.units}
        return model

    def _policies(self):
        """(the units' MixedPrecisionPolicy, BatchNorm's), or (None, None) in fp32. Inputs are
        not cast: the loop's autocast casts them where an operation needs it."""
        import torch

        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.run.precision)
        if low is None:
            return None, None
        policy = compat.mixed_precision_policy()
        return (
            policy(param_dtype=low, reduce_dtype=torch.float32, cast_forward_inputs=False),
            policy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False),
        )

    @staticmethod
    def _policy(policy) -> dict:
        return {} if policy is None else {"mp_policy": policy}

    def grad_scaler(self, device):
        from torch.distributed.fsdp import sharded_grad_scaler

        return sharded_grad_scaler.ShardedGradScaler(device.type)

    # ---- bytes, counted where each collective happens -------------------------------------
    _gathers = 0
    _world = 1
    _fp32: set = set()  # ids of the parameters gathered in fp32 in a 16-bit run (BatchNorm's)
    _bytes: dict = {}  # id(unit) -> UnitBytes

    def _own(self, unit) -> list:
        """The parameters a unit gathers and reduces itself (with its BatchNorm companion):
        all of a block's; the root's are those no block holds."""
        if unit is not self.units[-1]:
            return list(unit.parameters())
        inner = {id(p) for block in self.units[:-1] for p in block.parameters()}
        return [p for p in unit.parameters() if id(p) not in inner]

    def _ring_bytes(self, own: list, gather: bool) -> int:
        """What a rank sends (and receives) when a unit's shards (`own`) are all-gathered (at the
        weights' gathered dtype) or its gradients reduce-scattered (fp32) over a ring: (N-1) of
        its shards, padded as FSDP pads them."""
        low = GATHERED_BYTES.get(self.run.precision) if gather else None
        return (self._world - 1) * sum(
            p.to_local().numel() * (low if low and id(p) not in self._fp32 else p.element_size())
            for p in own
            if hasattr(p, "to_local")
        )

    def _unit_bytes(self, unit) -> UnitBytes:
        own = self._own(unit)
        ids = {id(p) for p in own}
        probe = next(
            (
                (module, name)
                for module in unit.modules()
                for name, p in module.named_parameters(recurse=False)
                if id(p) in ids
            ),
            None,
        )
        return UnitBytes(
            self._ring_bytes(own, gather=True),
            self._ring_bytes(own, gather=False),
            probe,
            any(p.requires_grad for p in own),
        )

    def _count_gather(self, unit, args):
        counted = self._bytes[id(unit)]
        if counted.probe and hasattr(getattr(*counted.probe), "to_local"):  # sharded: gathered now
            self._gathers += counted.gathered

    def _count_regather(self, unit, args, output):
        self._count_gather(unit, args)  # resharded after its forward: the backward gathers again

    def start(self, threads: int) -> Context:
        ctx = super().start(threads)
        self._world = ctx.processes
        return ctx

    def step(self, model, optimizer, ctx: Context) -> float:
        """The gradients were reduce-scattered during the backward (one per unit that has
        them); each rank steps its own shards: the weights are updated here, 1/N per rank."""
        reduced = sum(unit.reduced for unit in self._bytes.values() if unit.has_gradients)
        moved = self._gathers + reduced
        self._traffic.sent += moved
        self._traffic.received += moved
        self._gathers = 0
        optimizer.step()
        return 0.0

    # ---- the whole model, gathered ---------------------------------------------------------
    def consolidate(self, model, optimizer, ctx: Context) -> None:
        """Every rank takes part; rank 0 receives the full state dicts on the CPU."""
        from torch.distributed.checkpoint import state_dict as state_dict_api

        options = state_dict_api.StateDictOptions(full_state_dict=True, cpu_offload=True)
        self.gathered = {
            "model": state_dict_api.get_model_state_dict(model, options=options),
            "optimizer": state_dict_api.get_optimizer_state_dict(model, optimizer, options=options),
        }

    def checkpoint_state(self, model, optimizer) -> dict:
        return {
            "model": Gathered(self, "model", model, optimizer),
            "optimizer": Gathered(self, "optimizer", model, optimizer),
        }

    def model_state(self, model) -> dict:
        return self.gathered["model"]

    def scoring_model(self, model, ctx: Context):
        from torch.distributed.checkpoint import state_dict as state_dict_api

        options = state_dict_api.StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = state_dict_api.get_model_state_dict(model, options=options)
        if not ctx.reports:
            return None
        assert self._blueprint is not None  # made by wrap()
        plain = copy.deepcopy(self._blueprint).to_empty(device=ctx.device)
        plain.load_state_dict(state)
        return plain

    def checksum(self, model) -> str:
        """Of the whole parameters, gathered on every rank (each holds a different shard)."""
        from torch.distributed.checkpoint import state_dict as state_dict_api

        options = state_dict_api.StateDictOptions(full_state_dict=True)
        full = state_dict_api.get_model_state_dict(model, options=options)
        assert self._blueprint is not None  # made by wrap()
        return tensor_checksum(full[name] for name, _ in self._blueprint.named_parameters())

    def unwrap(self, model):
        return model
