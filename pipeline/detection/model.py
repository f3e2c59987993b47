"""torchvision Faster R-CNN, in two sizes.

* `tiny`: a small stride-8 backbone with one feature map and anchors matched to the object
  sizes. It trains from scratch on two CPU cores in minutes; torchvision's own mobile models do
  not (their stride-16/32 maps are too coarse for 128-px images).
* `fasterrcnn_resnet50_fpn`: the published recipe's model. Its ImageNet backbone weights come
  from torchvision's URL (`imagenet`), or from a local path or URL for offline clusters.

min_size/max_size are always passed: torchvision otherwise resizes every image to 800 px.

`model.norm` picks the tiny backbone's normalisation: `batchnorm` (the default) normalises over
each process's batch, so 2 workers of 4 images train with other statistics than 1 of 8 and keep
rank 0's buffers; `groupnorm` normalises each image on its own, the same on any split of the
batch (the accuracy ablation: pipeline/report/causes.py).

Each model declares the blocks FSDP shards one by one (`fsdp_units`, read by
pipeline/strategies/fsdp.py): each stage of the backbone's body that trains (a stage is the
natural unit of a ResNet; gathering one at a time bounds the transient memory by the largest),
the FPN, the RPN head and the ROI heads. What is left (the stem, frozen layers, the transform)
is FSDP's root.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torchvision.models import ResNet50_Weights, resnet50
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.ops import FrozenBatchNorm2d

from ..config import schema
from ..runtime.run import NORMS
from .roi_align import ThreadedRoIPool

GROUPS = 8  # GroupNorm's groups, fewer where a layer has fewer channels (the tiny model's are 8-64)


def norm_layer(norm: str, channels: int) -> nn.Module:
    if norm == "batchnorm":
        return nn.BatchNorm2d(channels)
    if norm == "groupnorm":
        return nn.GroupNorm(math.gcd(GROUPS, channels), channels)
    raise ValueError(f"model.norm: unknown normalisation {norm!r}; use one of {', '.join(NORMS)}")


def _conv(c_in: int, c_out: int, stride: int, norm: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), norm_layer(norm, c_out), nn.ReLU(inplace=True)
    )


class TinyBackbone(nn.Sequential):
    """Three stride-2 stages to stride 8, then two more 3x3 layers for context."""

    def __init__(self, channels: int, norm: str = "batchnorm"):
        c = channels
        super().__init__(
            *(
                _conv(c_in, c_out, stride, norm)
                for c_in, c_out, stride in (
                    (3, c // 4, 2),
                    (c // 4, c // 2, 2),
                    (c // 2, c // 2, 1),
                    (c // 2, c, 2),
                    (c, c, 1),
                    (c, c, 1),
                )
            )
        )
        self.out_channels = c


def declare_fsdp_units(model: FasterRCNN, body: str, *blocks: str) -> FasterRCNN:
    """`model.fsdp_units`: the names of the trainable stages of its backbone's `body`, then of
    its other `blocks`, in the order FSDP shards them (module docstring)."""
    stages = [
        f"{body}.{name}"
        for name, stage in model.get_submodule(body).named_children()
        if any(p.requires_grad for p in stage.parameters())
    ]
    model.fsdp_units = (*stages, *blocks, "rpn", "roi_heads")
    return model


def build_tiny(cfg: schema.Model, num_classes: int) -> FasterRCNN:
    # the tiny model's own keys, which params.py requires where model.name is tiny
    assert cfg.channels is not None and cfg.anchor_sizes is not None
    backbone = TinyBackbone(cfg.channels, cfg.norm)
    sizes = tuple(cfg.anchor_sizes)
    anchors = AnchorGenerator(sizes=(sizes,), aspect_ratios=((0.5, 1.0, 2.0),))
    roi_pool = ThreadedRoIPool(featmap_names=["0"], output_size=7, sampling_ratio=2)
    rep = cfg.representation_size
    model = FasterRCNN(
        backbone,
        num_classes=None,
        rpn_anchor_generator=anchors,
        box_roi_pool=roi_pool,
        box_head=TwoMLPHead(backbone.out_channels * 7 * 7, rep),
        box_predictor=FastRCNNPredictor(rep, num_classes),
        min_size=cfg.min_size,
        max_size=cfg.max_size,
        rpn_pre_nms_top_n_train=600,
        rpn_post_nms_top_n_train=300,
        rpn_pre_nms_top_n_test=300,
        rpn_post_nms_top_n_test=150,
        box_batch_size_per_image=128,
    )
    return declare_fsdp_units(model, "backbone")  # the backbone is its own body, without an FPN


def load_backbone_state(source: str) -> dict:
    """ResNet-50 ImageNet weights from torchvision's URL, another URL, or a local file."""
    if source == "imagenet":
        return ResNet50_Weights.IMAGENET1K_V1.get_state_dict(progress=True)
    if source.startswith(("http://", "https://")):
        # As torchvision downloads its own: cached under $TORCH_HOME, and a file named
        # <name>-<sha256 prefix>.pth must hash to that prefix (a bad download is refused).
        try:
            return torch.hub.load_state_dict_from_url(source, progress=True, map_location="cpu", check_hash=True)
        except RuntimeError as err:
            if "invalid hash value" not in str(err):
                raise
            raise ValueError(
                f"model.backbone_weights: {source} does not hash to the SHA-256 "
                f"prefix in its name ({err}); the download was discarded: check "
                "the URL, or the file the server holds"
            ) from err
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(
            f"model.backbone_weights: {source} is not a file; give a local ResNet-50 .pth, a URL, 'imagenet', or null"
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def build_resnet50_fpn(cfg: schema.Model, num_classes: int) -> FasterRCNN:
    if cfg.norm != "batchnorm":
        raise ValueError(
            f"model.norm: {cfg.norm} is for the tiny model; "
            "fasterrcnn_resnet50_fpn keeps torchvision's BatchNorm (frozen with "
            "pretrained weights): set model.norm: batchnorm"
        )
    pretrained = cfg.backbone_weights is not None
    trainable = cfg.trainable_backbone_layers if pretrained else 5
    # Frozen BatchNorm with pretrained weights, as torchvision does; plain BatchNorm from scratch.
    norm = FrozenBatchNorm2d if pretrained else nn.BatchNorm2d
    body = resnet50(weights=None, norm_layer=norm)
    source = cfg.backbone_weights
    if source is not None:  # pretrained
        try:
            missing, unexpected = body.load_state_dict(load_backbone_state(source), strict=False)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(
                f"model.backbone_weights: {source} is not a ResNet-50 state dict ({str(err).splitlines()[-1].strip()})"
            ) from err
        wrong = [k for k in missing + unexpected if not k.startswith("fc.")]
        if wrong:
            raise ValueError(
                f"model.backbone_weights: {source} is not a ResNet-50 state dict (mismatched keys such as {wrong[:3]})"
            )
    backbone = _resnet_fpn_extractor(body, trainable)
    model = FasterRCNN(backbone, num_classes=num_classes, min_size=cfg.min_size, max_size=cfg.max_size)
    return declare_fsdp_units(model, "backbone.body", "backbone.fpn")


def build_model(cfg: schema.Model, num_classes: int) -> FasterRCNN:
    if cfg.arch == "tiny":
        return build_tiny(cfg, num_classes)
    if cfg.arch == "fasterrcnn_resnet50_fpn":
        return build_resnet50_fpn(cfg, num_classes)
    raise ValueError(f"model.arch: unknown architecture {cfg.arch!r}")
