"""The speed knobs (pipeline/training/speed.py) change how fast a step runs, not what it
computes: one step's losses, gradients and updated weights with each knob on are those of the
default within float32's rounding, on the demo's tiny model and on R50-FPN at a small size."""
from __future__ import annotations


import functools

import pytest
import torch

from pipeline.config import params, schema
from pipeline.detection.model import build_model
from pipeline.training import speed
from pipeline.training.train import forward_backward
from pipeline.training.precision import Precision

from .conftest import REPO

DEFAULT = {"channels_last": False, "compile": False, "optimizer": "default"}


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> str:
    """A random ResNet-50 as a weights file: the recipe's model then freezes its BatchNorm and
    trains 3 stages, as on COCO (from scratch, BatchNorm over 2 images of 64 px amplifies
    rounding past any tolerance)."""
    from torchvision.models import resnet50
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("backbone") / "resnet50.pth"
    torch.save(resnet50(weights=None).state_dict(), path)
    return str(path)


@functools.cache
def preset(name: str) -> schema.Config:
    return params.load_resolved(REPO / "params.yaml", preset=name)


def model_cfg(arch: str, backbone: str | None = None) -> schema.Model:
    if arch == "tiny":
        return schema.replaced(preset("demo").model, min_size=64, max_size=64)
    return schema.replaced(preset("coco2017").model, backbone_weights=backbone, min_size=64, max_size=64)


def batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    images = [torch.rand(3, 64, 64, generator=generator) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[4.0, 6.0, 30.0, 40.0], [20.0, 10.0, 60.0, 50.0]]),
                "labels": torch.tensor([1, 2])} for _ in range(2)]
    return images, targets


def one_step(arch: str, backbone: str | None = None, **knobs) -> dict:
    """The losses, gradients and weights after one SGD step of a freshly seeded model."""
    train = schema.replaced(preset("demo").train, **{**DEFAULT, **knobs})
    torch.manual_seed(0)
    model = speed.apply(build_model(model_cfg(arch, backbone), num_classes=4), train)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.01, momentum=0.9, weight_decay=1e-4,
                                **speed.sgd_options(train))
    torch.manual_seed(1)  # the samplers of the heads draw the same proposals
    losses = forward_backward(model, optimizer, *batch(), Precision("fp32", torch.device("cpu")))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    grads = {n: p.grad.clone() for n, p in zip(names, trainable)}
    optimizer.step()
    return {"losses": {k: v.item() for k, v in losses.items()}, "grads": grads,
            "weights": {n: p.detach().clone() for n, p in zip(names, trainable)}}


def assert_same(a: dict, b: dict, rtol: float) -> None:
    """Losses within `rtol`, and each gradient and weight tensor within `rtol` of its size
    (the norm of the difference over the norm: rounding spreads over a sum's terms, so an
    element near zero may differ by more, relatively, than the tensor does)."""
    for key, value in a["losses"].items():
        assert b["losses"][key] == pytest.approx(value, rel=rtol, abs=rtol), key
    for part in ("grads", "weights"):
        assert a[part].keys() == b[part].keys()
        for name, ours in a[part].items():
            off = (b[part][name] - ours).norm() / ours.norm().clamp_min(1e-12)
            assert off <= rtol, f"{part} of {name}: {off:.2e} of its norm apart"


# float32 rounding, summed in another order: 1e-4 of a tensor's norm on the tiny model; through
# R50-FPN's 50 layers of a random backbone (frozen statistics, no calibration) measured 1.8e-4
# with channels-last. A wrong layout or a skipped update is off by the whole norm.
TOLERANCE = {"tiny": 1e-4, "fasterrcnn_resnet50_fpn": 1e-3}


# The real detector's case is the full suite's: its four steps of R50-FPN are a tenth of the
# fast tier's budget, and the tiny model takes the same knobs' code paths.
@pytest.mark.parametrize("arch", [pytest.param(arch, marks=pytest.mark.slow) if arch != "tiny" else arch
                                  for arch in TOLERANCE])
def test_channels_last_and_the_sgd_kernels_compute_the_defaults_step(arch, backbone):
    default = one_step(arch, backbone)
    assert all(torch.isfinite(torch.tensor(v)) for v in default["losses"].values())
    for knobs in ({"channels_last": True}, {"optimizer": "foreach"}, {"optimizer": "fused"}):
        assert_same(default, one_step(arch, backbone, **knobs), rtol=TOLERANCE[arch])
    # the optimizer knobs do not touch forward or backward: identical gradients
    fused = one_step(arch, backbone, optimizer="fused")
    assert all(torch.equal(fused["grads"][n], default["grads"][n]) for n in default["grads"])


@pytest.mark.slow
def test_the_compiled_backbone_computes_the_defaults_step(tmp_path, monkeypatch):
    """torch.compile of the tiny model's backbone on CPU (inductor's C++; slow to compile)."""
    # inductor's cache goes with the test, not into /tmp; its precompiled header (150 MB a run,
    # under /tmp whatever the cache dir, never reused by the next run) is not made
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(torch._inductor.config, "cpp_cache_precompile_headers", False)
    default = one_step("tiny")
    compiled = one_step("tiny", compile="backbone")
    assert_same(default, compiled, rtol=TOLERANCE["tiny"])
    # compiled in place: the names checkpoints and FSDP's units read are unchanged
    assert compiled["weights"].keys() == default["weights"].keys()


def test_a_compile_failure_names_the_knob_and_the_remedy():
    class Broken(Exception):
        pass
    Broken.__module__ = "torch._inductor.exc"  # as inductor's own errors are named
    assert speed.is_compile_error(Broken()) and not speed.is_compile_error(ValueError())
    message = str(speed.CompileFailed(Broken("C++ compiler not found\nmore")))
    assert "train.compile" in message and "set train.compile: false" in message
    assert "C++ compiler not found" in message and "more" not in message
