"""The sync counter (pipeline/measure/syncs.py) on a CPU: each kind of op that would make a GPU
and its host wait for each other is counted once, at the line that called it; a training step of
the tiny detector and of R50-FPN at a small size is counted by source."""
from __future__ import annotations

import inspect
from pathlib import Path

import torch
import torchvision

from pipeline.config.params import load_resolved
from pipeline.detection.model import build_model
from pipeline.measure.syncs import Sync, SyncCounter, by_op, by_source

REPO = Path(__file__).resolve().parents[1]
HERE = "tests/test_syncs.py"


def line_of(text: str) -> int:
    """The line of this file's toy step that holds `text`."""
    lines, start = inspect.getsourcelines(toy_step)
    return start + next(i for i, line in enumerate(lines) if text in line)


def toy_step(x: torch.Tensor) -> None:
    x.nonzero()
    x[x > 0]
    torch.where(x > 1)
    x.sum().item()
    bool(x.sum() > 0)
    x.tolist()
    x[torch.tensor([0, 1])]  # integer indices: the shape is known
    x.repeat_interleave(2)  # a number of repeats: known
    torchvision.ops.nms(torch.tensor([[0, 0, 1, 1.0], [0, 0, 1, 1.0]]), torch.tensor([1.0, 0.5]), 0.5)


def test_each_kind_is_counted_once_where_it_was_called():
    counter = SyncCounter()
    with counter:
        toy_step(torch.tensor([1.0, 0.0, 2.0]))
        step = counter.step()
    expected = {
        ("shape", "nonzero", "x.nonzero()"): 1,
        ("shape", "nonzero", "torch.where(x > 1)"): 1,
        ("shape", "index", "x[x > 0]"): 1,
        ("read", "item", ".item()"): 1,
        ("read", "__bool__", "bool(x.sum() > 0)"): 1,
        ("read", "tolist", "x.tolist()"): 1,
    }
    mine = {sync: n for sync, n in step.items() if sync.where.startswith(HERE)}
    assert mine == {Sync(kind, op, f"{HERE}:{line_of(text)} (toy_step)"): n for (kind, op, text), n in expected.items()}
    # NMS is named where torchvision calls its kernel: the first frame outside torch
    (nms,) = [sync for sync in step if sync.op == "nms"]
    assert nms.where.startswith("torchvision/ops/boxes.py:") and step[nms] == 1
    # torch.where(cond) is a nonzero too: two nonzero in all, at two lines
    assert by_op(step)["nonzero"] == 2
    assert sum(step.values()) == 7  # integer indexing and a number of repeats are not counted
    assert counter.steps == [step] and not counter.current


def detector(arch: str, **changes) -> torch.nn.Module:
    model_cfg = load_resolved(REPO / "params.yaml", preset="demo").model.model_copy(update={"arch": arch, **changes})
    torch.manual_seed(0)
    return build_model(model_cfg, num_classes=5).train()


def counted_step(model: torch.nn.Module, images: int) -> SyncCounter:
    torch.manual_seed(1)
    batch = [torch.rand(3, 128, 128) for _ in range(images)]
    targets = [{"boxes": torch.tensor([[10.0, 12.0, 60.0, 70.0], [30.0, 30.0, 90.0, 100.0]]),
                "labels": torch.tensor([1, 3])} for _ in range(images)]
    counter = SyncCounter()
    with counter:
        losses = model(batch, targets)
        sum(losses.values()).backward()
        counter.step()
    return counter


def test_a_tiny_detectors_step_is_counted_by_source_and_grows_with_its_images():
    """torchvision's heads loop over the images of a batch in Python: today's baseline (issue 59)
    is a count that grows with the images a step, most of it inside torchvision's detection."""
    model = detector("tiny")
    two, four = (counted_step(model, n).steps[0] for n in (2, 4))
    assert sum(four.values()) > sum(two.values()) > 0
    sources = by_source(four)
    assert any("torchvision/models/detection/" in where for _, where in sources)
    assert by_op(four)["nonzero"] > 0


def test_r50_fpn_at_a_small_size_is_counted_too():
    model = detector("fasterrcnn_resnet50_fpn", backbone_weights=None, min_size=128, max_size=128)
    step = counted_step(model, 2).steps[0]
    assert sum(step.values()) > 0
    assert any("torchvision/models/detection/rpn.py" in sync.where for sync in step)
