"""The loader: boxes stay consistent through transforms; the COCO recipe's skips; bad input."""
from __future__ import annotations

import json
import logging

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from pipeline.data.dataset import (
    MIRROR,
    CocoDetection,
    DatasetError,
    annotation_path,
    build_manifest,
    clean_box,
    collate,
    to_model_input,
)
from pipeline.data.sampler import ShardedBatchSampler, aspect_ratio_groups
from pipeline.training.train import to_device

from .conftest import write_coco


def test_targets_match_annotations(small_dataset):
    dataset = CocoDetection(small_dataset, "val", train=False)
    document = json.loads(annotation_path(small_dataset, "val").read_text())
    for index in range(len(dataset)):
        image, target = dataset[index]
        assert image.dtype == torch.uint8 and image.shape[0] == 3
        expected = [a for a in document["annotations"] if a["image_id"] == target["image_id"]]
        boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in expected)])
        assert torch.equal(target["boxes"], boxes.reshape(-1, 4).float())
        assert target["labels"].tolist() == [a["category_id"] for a in expected]
    assert dataset.num_classes == 6


def test_horizontal_flip_moves_boxes_with_pixels(small_dataset):
    plain = CocoDetection(small_dataset, "train", train=True, horizontal_flip=0.0)
    flipped = CocoDetection(small_dataset, "train", train=True, horizontal_flip=1.0)
    image, target = plain[0]
    image_f, target_f = flipped[0]
    width = image.shape[-1]
    assert torch.equal(image_f, image.flip(-1))
    mirrored = target["boxes"][:, [2, 1, 0, 3]] * torch.tensor([-1, 1, -1, 1]) + torch.tensor([width, 0, width, 0])
    assert torch.allclose(target_f["boxes"], mirrored)
    assert torch.equal(target_f["labels"], target["labels"])


def test_model_sees_the_float_loaders_pixels_bit_for_bit(small_dataset):
    """The loader hands uint8 and `to_device` scales it: the model must see what the loader's
    former float path gave (v2.ToImage + ToDtype(scale) on the PIL image, then the flip)."""
    float_loader = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    dataset = CocoDetection(small_dataset, "train", train=True, horizontal_flip=0.5)
    dataset.set_epoch(seed=0, epoch=0)
    flipped = [i for i in range(len(dataset)) if dataset.flips(i)]
    plain = [i for i in range(len(dataset)) if not dataset.flips(i)]
    indices = flipped[:2] + plain[:2]
    assert len(indices) == 4  # flipped and unflipped images both checked
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, indices),
                                         batch_size=len(indices), collate_fn=collate)
    batch = next(iter(loader))
    assert all(image.dtype == torch.uint8 for image in batch[0])
    images, targets = to_device(*batch, torch.device("cpu"))
    for index, image, target in zip(indices, images, targets):
        expected, boxes = float_loader(dataset.load_image(index), dataset.target(index)["boxes"])
        if index in flipped:
            expected, boxes = MIRROR(expected, boxes)
        assert image.dtype == torch.float32 and image.shape == expected.shape
        # Bit for bit (torch.equal would let -0.0 pass for 0.0): the float32 words themselves.
        assert torch.equal(image.contiguous().view(torch.int32), expected.contiguous().view(torch.int32))
        assert torch.equal(target["boxes"], boxes.as_subclass(torch.Tensor))
    already = torch.rand(3, 4, 5)
    assert to_model_input(already, torch.device("cpu")) is already  # float passes through


def test_clean_box():
    assert clean_box([10, 10, 5, 5], 100, 100) == [10, 10, 15, 15]
    assert clean_box([-5, 90, 20, 20], 100, 100) == [0, 90, 15, 100]  # clamped into the image
    assert clean_box([10, 10, 0, 5], 100, 100) is None                # zero width
    assert clean_box([150, 10, 5, 5], 100, 100) is None               # entirely outside
    # What no recipe can mean is an error (the loader names the annotation: test_bad_inputs).
    with pytest.raises(ValueError, match="negative width or height"):
        clean_box([10, 10, -4, 5], 100, 100)
    with pytest.raises(ValueError, match="NaN or infinite"):
        clean_box([10, float("nan"), 5, 5], 100, 100)
    with pytest.raises(ValueError, match="not 4 numbers"):
        clean_box([10, 10, 5], 100, 100)


def _images(root, split, n):
    images = []
    for i in range(1, n + 1):
        Image.new("RGB", (64, 48), (i * 20, 0, 0)).save(root / f"{split}2017" / f"{i}.jpg")
        images.append({"id": i, "file_name": f"{i}.jpg", "width": 64, "height": 48})
    return images


def _ann(i, image_id, bbox, **extra):
    return {"id": i, "image_id": image_id, "category_id": 1, "bbox": bbox, "area": 1.0, **extra}


def test_recipe_skips_are_logged(tmp_path, caplog):
    write_coco(tmp_path, "train", [], [])
    images = _images(tmp_path, "train", 4)
    annotations = [_ann(1, 1, [1, 1, 10, 10]),
                   _ann(2, 2, [1, 1, 10, 10], iscrowd=1),    # crowd only: not a training target
                   _ann(3, 3, [5, 5, 0, 8]),                  # zero width
                   _ann(4, 1, [70, 60, 5, 5]),                # outside the image
                   _ann(5, 1, [60, 40, 10, 10])]              # partly outside: clamped
    write_coco(tmp_path, "train", images, annotations)        # image 4: no annotations at all
    with caplog.at_level(logging.WARNING):
        train = CocoDetection(tmp_path, "train", train=True)
    assert train.image_ids() == [1]
    assert train.skipped == {"crowd annotations (training)": 1, "images without usable boxes (training)": 3,
                             "boxes of zero width or height": 1, "boxes entirely outside their image": 1}
    assert train.clamped == 1
    assert "skipped 3 images without usable boxes" in caplog.text
    _, target = train[0]
    assert target["boxes"].tolist() == [[1, 1, 11, 11], [60, 40, 64, 48]]
    evaluation = CocoDetection(tmp_path, "train", train=False)  # evaluation keeps every image
    assert evaluation.image_ids() == [1, 2, 3, 4]
    assert evaluation[1][1]["iscrowd"].tolist() == [1]


def test_missing_image_is_named(tmp_path):
    (tmp_path / "val2017").mkdir(parents=True)
    images = _images(tmp_path, "val", 2)
    (tmp_path / "val2017" / "2.jpg").unlink()
    write_coco(tmp_path, "val", images, [_ann(1, 1, [1, 1, 5, 5])])
    with pytest.raises(DatasetError, match=r"val2017: 1 image\(s\) .* missing, e.g. \['2.jpg'\]"):
        CocoDetection(tmp_path, "val", train=False)


def test_corrupt_image_is_named(tmp_path):
    (tmp_path / "val2017").mkdir(parents=True)
    images = _images(tmp_path, "val", 1)
    (tmp_path / "val2017" / "1.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    write_coco(tmp_path, "val", images, [])
    dataset = CocoDetection(tmp_path, "val", train=False)
    with pytest.raises(DatasetError, match=r"1\.jpg: cannot decode image 1"):
        dataset[0]
    (tmp_path / "train2017").mkdir()
    write_coco(tmp_path, "train", _images(tmp_path, "train", 1), [_ann(1, 1, [1, 1, 5, 5])])
    assert build_manifest(tmp_path, splits=("train",))["splits"]["train"]["images"] == 1
    with pytest.raises(DatasetError, match=r"val2017/1\.jpg: cannot decode"):
        build_manifest(tmp_path)  # the data stage decodes every image of every split


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"images": [], "categories": []}), "missing the 'annotations' list"),
    (json.dumps({"images": [{"id": 1}], "annotations": [], "categories": []}),
     "images entry 1 lacks file_name, width, height"),
])
def test_malformed_annotation_file(tmp_path, content, message):
    path = write_coco(tmp_path, "val", [], [])
    path.write_text(content)
    with pytest.raises(DatasetError, match=message) as err:
        CocoDetection(tmp_path, "val", train=False)
    assert str(path) in str(err.value)


def test_empty_dataset_and_dangling_references(tmp_path):
    write_coco(tmp_path, "train", [], [])
    with pytest.raises(DatasetError, match="no usable images in the train split"):
        CocoDetection(tmp_path, "train", train=True)
    write_coco(tmp_path, "train", [], [_ann(1, 99, [0, 0, 5, 5])])
    with pytest.raises(DatasetError, match="annotation 1 refers to image 99"):
        CocoDetection(tmp_path, "train", train=True)
    with pytest.raises(DatasetError, match="annotation file not found"):
        CocoDetection(tmp_path / "nowhere", "val", train=False)


def test_sampler_is_deterministic_sharded_even_and_takes_full_batches_only():
    groups = aspect_ratio_groups([0.5, 1.0, 2.0, 1.0, 0.5] * 5, 2)
    assert len(set(groups)) == 3
    batches = {rank: list(ShardedBatchSampler(25, 4, seed=3, rank=rank, world_size=2, group_ids=groups))
               for rank in (0, 1)}
    # 13 images per rank: 3 full batches each, the short fourth dropped (the reference's recipe)
    assert len(batches[0]) == len(batches[1]) == 3
    assert all(len(batch) == 4 for rank in batches for batch in batches[rank])
    # grouping never mixes aspect ratios, even in the batches completed from leftovers
    assert all(len({groups[i] for i in batch}) == 1 for rank in batches for batch in batches[rank])
    again = list(ShardedBatchSampler(25, 4, seed=3, rank=0, world_size=2, group_ids=groups))
    assert again == batches[0]
    sampler = ShardedBatchSampler(25, 4, seed=3, rank=0, world_size=2, group_ids=groups)
    sampler.set_epoch(1)
    assert list(sampler) != batches[0]
    sampler.set_epoch(1, skip=2)
    assert len(list(sampler)) == 1
    # Without grouping: consecutive slices of the shuffled order, the tail dropped
    plain = list(ShardedBatchSampler(10, 4, seed=3))
    assert len(plain) == 2 and len({i for batch in plain for i in batch}) == 8
    many = aspect_ratio_groups([0.5, 1.0, 2.0, 1.0, 0.5] * 40, 2)
    batches = list(ShardedBatchSampler(200, 4, seed=3, group_ids=many))
    assert len(batches) == 50 and all(len({many[i] for i in b}) == 1 for b in batches)
    with pytest.raises(ValueError, match="fewer than one batch of 8: lower images_per_worker"):
        ShardedBatchSampler(10, 8, seed=0, world_size=2)


def test_in_memory_data_has_the_shapes_and_targets_without_reading_images(small_dataset, tmp_path):
    import shutil

    from pipeline.data.dataset import InMemory

    root = tmp_path / "copy"
    shutil.copytree(small_dataset, root)
    real = CocoDetection(root, "train", train=True)
    memory = InMemory(real, pool=3, seed=5)
    shutil.rmtree(root / "train2017")  # made once: nothing is decoded afterwards
    assert len(memory) == len(real) and memory.num_classes == real.num_classes
    assert memory.aspect_ratios() == real.aspect_ratios()
    for index in range(len(memory)):
        image, target = memory[index]
        source, _ = real.images[index % 3]
        assert image.shape == (3, source["height"], source["width"]) and image.dtype == torch.uint8
        expected = real.target(index % 3)
        assert torch.equal(target["boxes"], expected["boxes"].as_subclass(torch.Tensor))
        assert torch.equal(target["labels"], expected["labels"])
    again = InMemory(CocoDetection(small_dataset, "train", train=True), pool=3, seed=5)
    assert torch.equal(again[0][0], memory[0][0])  # the same pixels from the same seed
