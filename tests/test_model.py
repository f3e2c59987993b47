"""Model builders: the tiny CPU model and the recipe's ResNet-50 FPN, with every weight source
that does not need the internet (none, a local file, a URL on a local HTTP server)."""
from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import threading

import pytest
import torch
from torchvision.models import resnet50

from pipeline.config import schema
from pipeline.config.params import load_resolved
from pipeline.detection.model import build_model
from pipeline.strategies.process import gradient_bytes

from .conftest import REPO


@pytest.fixture(scope="module")
def configs():
    return {name: load_resolved(REPO / "params.yaml", preset=name) for name in ("demo", "coco2017")}


def test_tiny_model_trains_and_predicts_at_image_size(configs):
    torch.manual_seed(0)
    model = build_model(configs["demo"].model, num_classes=6)
    size = configs["demo"].model.min_size
    images = [torch.rand(3, size, size) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[10.0, 10.0, 40.0, 50.0]]), "labels": torch.tensor([2])}] * 2
    losses = model(images, targets)
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    assert all(torch.isfinite(v) for v in losses.values())
    batched, _ = model.transform(images)
    assert batched.tensors.shape[-2:] == (size, size)  # no silent upsampling to 800 px
    model.eval()
    with torch.no_grad():
        outputs = model(images)
    assert len(outputs) == 2 and set(outputs[0]) == {"boxes", "scores", "labels"}
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # CPU-sized


def test_recipe_model_builds_without_downloading(configs):
    cfg = schema.replaced(configs["coco2017"].model, backbone_weights=None)
    model = build_model(cfg, num_classes=91)
    assert model.roi_heads.box_predictor.cls_score.out_features == 91
    assert model.transform.min_size == (800,) and model.transform.max_size == 1333
    assert all(p.requires_grad for p in model.backbone.body.parameters())  # from scratch: all train


@pytest.fixture(scope="module")
def backbone_file(tmp_path_factory):
    torch.manual_seed(1)
    state = resnet50().state_dict()
    path = tmp_path_factory.mktemp("weights") / "resnet50-local.pth"
    torch.save(state, path)
    return path, state


def _assert_loaded(model, state):
    body = model.backbone.body.state_dict()
    assert torch.equal(body["conv1.weight"], state["conv1.weight"])
    assert torch.equal(body["layer4.2.conv3.weight"], state["layer4.2.conv3.weight"])


def test_backbone_from_local_file(configs, backbone_file):
    path, state = backbone_file
    cfg = schema.replaced(configs["coco2017"].model, backbone_weights=str(path))
    model = build_model(cfg, num_classes=91)
    _assert_loaded(model, state)
    trainable = {name.split(".")[0] for name, p in model.backbone.body.named_parameters() if p.requires_grad}
    assert trainable == {"layer2", "layer3", "layer4"}  # trainable_backbone_layers: 3
    # the cost model's M for the predicted scaling is this model's, as coco2017 trains it
    assumed = load_resolved(REPO / "params.yaml").report.predict.compute.gradient_bytes
    assert gradient_bytes(model) == assumed


def test_backbone_from_url_on_local_server(configs, backbone_file, tmp_path, monkeypatch):
    """Named as torchvision names its files (resnet50-<sha256 prefix>.pth): the download is
    checked against the prefix, cached under $TORCH_HOME, and a mismatch is refused."""
    path, state = backbone_file
    served = tmp_path / "served"
    served.mkdir()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    good, bad = served / f"resnet50-{digest[:8]}.pth", served / "resnet50-00000000.pth"
    shutil.copy2(path, good)
    shutil.copy2(path, bad)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        model = build_model(schema.replaced(configs["coco2017"].model, backbone_weights=f"{base}/{good.name}"),
                            num_classes=91)
        with pytest.raises(ValueError, match="resnet50-00000000.pth does not hash to the SHA-256 prefix"):
            build_model(schema.replaced(configs["coco2017"].model, backbone_weights=f"{base}/{bad.name}"),
                        num_classes=91)
    finally:
        server.shutdown()
    _assert_loaded(model, state)
    cached = [p.name for p in (tmp_path / "torch-home").rglob("*.pth")]
    assert cached == [good.name]  # cached for the next run; the bad download was not kept


def test_wrong_weights_are_refused(configs, tmp_path):
    missing = schema.replaced(configs["coco2017"].model, backbone_weights=str(tmp_path / "nope.pth"))
    with pytest.raises(FileNotFoundError, match="model.backbone_weights: .*nope.pth is not a file"):
        build_model(missing, num_classes=91)
    wrong = tmp_path / "wrong.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, wrong)
    with pytest.raises(ValueError, match="wrong.pth is not a ResNet-50 state dict"):
        build_model(schema.replaced(configs["coco2017"].model, backbone_weights=str(wrong)), num_classes=91)


def gradients(model, images, targets) -> dict[str, torch.Tensor]:
    model.zero_grad()
    sum(model(images, targets).values()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_threaded_roi_align_backward_is_torchvisions_bit_for_bit(configs, monkeypatch):
    """The tiny model's pooler spreads roi_align's CPU backward over threads by channel; every
    gradient must equal torchvision's own single-threaded kernel's exactly."""
    from torchvision.ops import MultiScaleRoIAlign

    from pipeline.detection.roi_align import ThreadedRoIPool

    torch.manual_seed(0)
    model = build_model(configs["demo"].model, num_classes=6)
    assert isinstance(model.roi_heads.box_roi_pool, ThreadedRoIPool)
    size = configs["demo"].model.min_size
    images = [torch.rand(3, size, size) for _ in range(4)]
    targets = [{"boxes": torch.tensor([[10.0, 12.0, 60.0, 70.0], [70.0, 5.0, 120.0, 40.0]]),
                "labels": torch.tensor([2, 3])}] * 4
    torch.set_num_threads(2)
    state = torch.random.get_rng_state()
    threaded = gradients(model, images, targets)
    torch.random.set_rng_state(state)  # the same proposals sampled
    monkeypatch.setattr(ThreadedRoIPool, "forward", MultiScaleRoIAlign.forward)
    reference = gradients(model, images, targets)
    assert threaded.keys() == reference.keys()
    assert all(torch.equal(threaded[k], reference[k]) for k in reference)
