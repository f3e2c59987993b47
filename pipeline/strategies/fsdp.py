"""`fsdp`: fully sharded data parallel, FSDP2 (`fully_shard`), one process per worker by torchrun.

Every parameter, its gradient and its momentum are split over the N ranks (dim 0 of each
tensor, 1/N each): no rank holds the whole model between steps. The detector is sharded in
units, each gathered only while it computes:
  * each stage of the backbone's body that trains (ResNet-50's layer2-4 as coco2017 freezes
    conv1 and layer1; the tiny backbone's six conv blocks): a stage is the natural unit of a
    ResNet, and gathering one at a time bounds the transient memory by the largest stage;
  * the FPN, the RPN head and the ROI heads (box head and predictor): each runs as one block;
  * the root: what is left (the stem, frozen layers, the transform), gathered for the whole
    forward and, as FSDP2 advises for the root, kept gathered into the backward.
Forward: each unit all-gathers its weights before it runs. Backward: with
`reshard_after_forward: true` (ZeRO-3) each unit gathers them again, then reduce-scatters its
gradients, so each rank keeps the averaged 1/N it owns; with `false` (ZeRO-2-like) the weights
stay gathered between forward and backward: less traffic, more memory. Each rank then steps its
own shard (the optimizer sees only sharded tensors). Per rank: 3(N-1)/N M (reshard) or
2(N-1)/N M (keep) each way, M the gradient bytes.

Runs in fp32 only. bf16 through FSDP2's MixedPrecisionPolicy casts the parameters but not the
buffers nor the tensors the detector builds itself, so BatchNorm's running statistics (and
FrozenBatchNorm's), RoIAlign's boxes and the box head's input stay fp32 beside bf16 weights:
measured on CPU, batch_norm stops with "expected scalar type BFloat16 but found Float". Making
the detector's mixed-dtype operations agree is left to do; the loop's autocast, a second
path, is not used instead. fp16 would also need a loss scale agreed over the shards.
Checkpoints hold the gathered full state dicts (torch.distributed.checkpoint.state_dict's
full_state_dict), written by rank 0 and read by every rank, so a checkpoint is a plain model and
a plain optimizer state keyed by parameter name, whatever the world size.
"""
from __future__ import annotations

import copy

from ..costmodel.network import Flow
from ..runtime import compat, lazy
from .base import Context, Option, tensor_checksum
from .torchrun import TorchrunStrategy

state_dict_api = lazy.module("torch.distributed.checkpoint.state_dict")


def shard_units(model) -> list:
    """The detector's blocks that are sharded one by one (module docstring); of another model
    (a test's), its children that train."""
    if not hasattr(model, "backbone"):
        return [m for m in model.children() if any(p.requires_grad for p in m.parameters())]
    backbone = model.backbone
    body = getattr(backbone, "body", backbone)  # R50-FPN's IntermediateLayerGetter; tiny: itself
    stages = [m for m in body.children() if any(p.requires_grad for p in m.parameters())]
    return stages + [m for m in (getattr(backbone, "fpn", None), model.rpn, model.roi_heads) if m is not None]


class Gathered:
    """A model's or optimizer's state as a checkpoint sees it: the full state dict gathered by
    `FSDP.consolidate` (read on rank 0), loaded by every rank back into its shards."""

    def __init__(self, strategy: "FSDP", part: str, model, optimizer):
        self.strategy, self.part, self.model, self.optimizer = strategy, part, model, optimizer

    def state_dict(self) -> dict:
        return self.strategy.gathered[self.part]

    def load_state_dict(self, state: dict) -> None:
        options = state_dict_api.StateDictOptions(full_state_dict=True)
        if self.part == "model":
            state_dict_api.set_model_state_dict(self.model, state, options=options)
        else:
            state_dict_api.set_optimizer_state_dict(self.model, self.optimizer, state, options=options)


class FSDP(TorchrunStrategy):
    name = "fsdp"
    label = "FSDP2"
    options = {"reshard_after_forward": Option(
        True, {"type": "boolean"},
        "true: ZeRO-3, weights gathered again for the backward; false: kept gathered (ZeRO-2-like)")}
    evaluates_on_workers = False  # model_final.pt is the whole model: one process scores it
    equivalence_entry = {"workers": 2, "images_per_worker": 4}
    theory_text = ("3(N-1)/N M per rank for FSDP with resharding after forward (all-gather in "
                   "forward and again in backward, reduce-scatter of the gradients) and "
                   "2(N-1)/N M without")
    memory_text = ("1/N of the weights, gradients and momentum (3M/N), and while a block computes, "
                   "its whole weights (and gradients in the backward): at most the largest block")
    bytes_counted = ("FSDP's are the bytes of each unit's shards as a ring all-gather or "
                     "reduce-scatter moves them, counted when each unit gathers its weights "
                     "(seen sharded as it starts its forward, or resharded after it) and when "
                     "it reduces its gradients.")

    @classmethod
    def predicted_curves(cls, predict: dict) -> dict[str, dict]:
        return {"FSDP (ZeRO-3, reshard)": {"strategy": cls.name, "reshard_after_forward": True},
                "FSDP (keep gathered)": {"strategy": cls.name, "reshard_after_forward": False}}

    @classmethod
    def variant(cls, run: dict) -> str:
        return "" if run.get("reshard_after_forward", True) else "keep"

    @classmethod
    def invalid(cls, run: dict) -> str | None:
        if run.get("precision", "fp32") != "fp32":
            return ("fsdp runs in fp32 only: FSDP2's MixedPrecisionPolicy casts the weights but "
                    "not the detector's BatchNorm statistics, RoIAlign boxes or box-head inputs "
                    "(batch_norm: expected scalar type BFloat16 but found Float); use "
                    "precision: fp32, or ddp/zero for bf16 and fp16 (autocast)")
        return super().invalid(run)

    def unavailable(self) -> str | None:
        if self.parallel["sync_batchnorm"]:
            return "sync_batchnorm is implemented for ddp only"
        return super().unavailable()

    def __init__(self, run: dict, parallel: dict):
        super().__init__(run, parallel)
        self.gathered: dict = {}
        self.units: list = []
        self._blueprint = None  # the model's structure on the meta device, to score a gathered copy

    def wrap(self, model, ctx: Context):
        self._blueprint = copy.deepcopy(model).to("meta")
        fully_shard = compat.fully_shard()
        self.units = shard_units(model)
        for unit in self.units:
            fully_shard(unit, reshard_after_forward=self.run.get("reshard_after_forward", True))
            unit.register_forward_pre_hook(self._count_gather, prepend=True)
            unit.register_forward_hook(self._count_regather)
        fully_shard(model)  # the root: reshard_after_forward left to FSDP2 (kept for backward)
        model.register_forward_pre_hook(self._count_gather, prepend=True)
        self.units.append(model)
        return model

    # ---- bytes, counted where each collective happens -------------------------------------
    def _ring_bytes(self, module) -> int:
        """What a rank sends (and receives) when the unit's shards are all-gathered or its
        gradients reduce-scattered over a ring: (N-1) of its shards, padded as FSDP pads them."""
        own = module.parameters() if module is not self.units[-1] else self._root_parameters()
        return (self._world - 1) * sum(p.to_local().numel() * p.to_local().element_size()
                                       for p in own if hasattr(p, "to_local"))

    def _root_parameters(self):
        inner = {id(p) for unit in self.units[:-1] for p in unit.parameters()}
        return [p for p in self.units[-1].parameters() if id(p) not in inner]

    def _count_gather(self, module, args):
        shards = self._root_parameters() if module is self.units[-1] else list(module.parameters())
        if self._world > 1 and any(hasattr(p, "to_local") for p in shards):  # gathered now
            self._gathers += self._ring_bytes(module)

    def _count_regather(self, module, args, output):
        if self._world > 1 and any(hasattr(p, "to_local") for p in module.parameters()):
            self._gathers += self._ring_bytes(module)  # resharded: the backward gathers again

    _gathers = 0
    _world = 1

    def start(self, threads: int) -> Context:
        ctx = super().start(threads)
        self._world = ctx.processes
        return ctx

    def step(self, model, optimizer, ctx: Context) -> float:
        """The gradients were reduce-scattered during the backward (one per unit that has
        them); each rank steps its own shards: the weights are updated here, 1/N per rank."""
        reduced = sum(self._ring_bytes(unit) for unit in self.units
                      if any(p.grad is not None for p in
                             (self._root_parameters() if unit is self.units[-1] else unit.parameters())))
        moved = self._gathers + (reduced if self._world > 1 else 0)
        self._traffic.sent += moved
        self._traffic.received += moved
        self._gathers = 0
        optimizer.step()
        return 0.0

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        wire = self.link_bytes(self.run, grad_bytes)["worker"]
        return {"sent": wire, "received": wire}

    @classmethod
    def phases(cls, run: dict, grad_bytes: float) -> list[list[Flow]]:
        """Ring all-gathers of the weights in forward (and again in backward when resharding),
        and a ring reduce-scatter of the gradients: (N-1)/N M per rank each, in N-1 steps."""
        n = run["workers"]
        if n < 2:
            return []
        ring = [Flow(("worker", i), ("worker", (i + 1) % n), grad_bytes * (n - 1) / n, n - 1)
                for i in range(n)]
        return [ring] * (3 if run.get("reshard_after_forward", True) else 2)

    @classmethod
    def memory_theory(cls, run: dict, grad_bytes: float) -> dict[str, float]:
        n = run["workers"]
        return {"parameters": grad_bytes / n, "gradients": grad_bytes / n, "optimizer": grad_bytes / n}

    # ---- the whole model, gathered ---------------------------------------------------------
    def consolidate(self, model, optimizer, ctx: Context) -> None:
        """Every rank takes part; rank 0 receives the full state dicts on the CPU."""
        options = state_dict_api.StateDictOptions(full_state_dict=True, cpu_offload=True)
        self.gathered = {
            "model": state_dict_api.get_model_state_dict(model, options=options),
            "optimizer": state_dict_api.get_optimizer_state_dict(model, optimizer, options=options)}

    def checkpoint_state(self, model, optimizer) -> dict:
        return {"model": Gathered(self, "model", model, optimizer),
                "optimizer": Gathered(self, "optimizer", model, optimizer)}

    def model_state(self, model) -> dict:
        return self.gathered["model"]

    def scoring_model(self, model, ctx: Context):
        options = state_dict_api.StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = state_dict_api.get_model_state_dict(model, options=options)
        if not ctx.reports:
            return None
        plain = copy.deepcopy(self._blueprint).to_empty(device=ctx.device)
        plain.load_state_dict(state)
        return plain

    def checksum(self, model) -> str:
        """Of the whole parameters, gathered on every rank (each holds a different shard)."""
        options = state_dict_api.StateDictOptions(full_state_dict=True)
        full = state_dict_api.get_model_state_dict(model, options=options)
        return tensor_checksum(full[name] for name, _ in self._blueprint.named_parameters())

    def unwrap(self, model):
        return model
