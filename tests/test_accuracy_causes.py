"""The accuracy ablation: the `norm` knob (model.norm and a sweep entry's `norm`), the one-step
check's distances with and without each cause, and the report's CauseTest."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline import equivalence
from pipeline.config import params, schema, stages
from pipeline.config.params import ParamsError
from pipeline.data.dataset import CocoDetection, collate, to_model_input
from pipeline.detection.model import TinyBackbone, build_model
from pipeline.report import causes
from pipeline.report.load import RunDir
from pipeline.report.noise import comparisons
from pipeline.report.verdict import VerdictInput, verdict
from pipeline.runtime.records.equivalence import EquivalenceRecord
from pipeline.runtime.records.evaluation import Metrics
from pipeline.runtime.records.training import RunSummary
from pipeline.runtime.run import NORMS, Run
from pipeline.strategies import sweep

from .conftest import REPO, small_config
from .test_answer import COMPARED, DDP, SINGLE, ZERO, summary_of


def old_tiny_backbone(c: int) -> nn.Sequential:
    """The tiny backbone as it was built before the knob (plain BatchNorm, written out)."""
    def conv(c_in, c_out, stride):
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False),
                             nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))
    return nn.Sequential(conv(3, c // 4, 2), conv(c // 4, c // 2, 2), conv(c // 2, c // 2, 1),
                         conv(c // 2, c, 2), conv(c, c, 1), conv(c, c, 1))


def test_the_default_norm_builds_the_backbone_bit_for_bit_as_before(tmp_path):
    torch.manual_seed(3)
    old = old_tiny_backbone(32)
    torch.manual_seed(3)
    new = TinyBackbone(32, small_config(tmp_path).model.norm)
    assert old.state_dict().keys() == new.state_dict().keys()
    assert all(torch.equal(old.state_dict()[k], new.state_dict()[k]) for k in old.state_dict())
    assert torch.rand(1).item() == (torch.manual_seed(3), old_tiny_backbone(32), torch.rand(1))[2].item()
    images = torch.rand(2, 3, 48, 48)
    assert torch.equal(old.train()(images), new.train()(images))


def test_groupnorm_trains_with_finite_losses(small_dataset):
    cfg = small_config(small_dataset)
    torch.manual_seed(0)
    model = build_model(schema.replaced(cfg.model, norm="groupnorm"), 91)
    kinds = {type(m) for m in model.backbone.modules()}
    assert nn.GroupNorm in kinds and nn.BatchNorm2d not in kinds
    dataset = CocoDetection(small_dataset, "train", train=True)
    images, targets = collate([dataset[i] for i in range(2)])
    images = [to_model_input(image, "cpu") for image in images]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model.train()
    for _ in range(2):
        losses = model(images, list(targets))
        loss = sum(losses.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert all(math.isfinite(v.item()) for v in losses.values()), losses


def test_a_sweep_entry_names_its_norm_and_the_default_leaves_runs_as_they_were(tmp_path):
    entries = [{"strategy": "single", "workers": 1},
               {"strategy": "ddp", "workers": 2, "images_per_worker": 2, "norm": "groupnorm"}]
    cfg = schema.replaced(small_config(tmp_path), sweep=entries)
    runs = sweep.runs(cfg)
    assert list(runs) == ["single-w1-b4-s0", "ddp-w2-b2-groupnorm-s0"]
    assert "norm" not in runs["single-w1-b4-s0"].to_json()  # params, ids, fingerprints unchanged
    assert Run.from_json(runs["ddp-w2-b2-groupnorm-s0"].to_json()).norm == "groupnorm"
    assert sweep.swept_norms(cfg) == list(NORMS)
    wrong = schema.replaced(cfg, sweep=[entries[0], dict(entries[1], norm="layernorm")])
    with pytest.raises(ParamsError, match=r"sweep\[1\]\.norm: 'layernorm' is not one of"):
        sweep.runs(wrong)


def test_groupnorm_is_refused_for_the_resnet50_model(tmp_path):
    model = schema.replaced(small_config(tmp_path).model, arch="fasterrcnn_resnet50_fpn", norm="groupnorm")
    with pytest.raises(ValueError, match="model.norm: groupnorm is for the tiny model"):
        build_model(model, 91)


@pytest.mark.slow
def test_the_step_check_measures_each_cause_on_real_processes(small_dataset):
    """single and ddp-w2 (2 processes over gloo) take one step under each norm: under GroupNorm
    ddp's step lands nearer single's than under BatchNorm, and no further than resampling the
    same images moves it (the sampling alone)."""
    report = equivalence.measure(stages.view(small_config(small_dataset), "equivalence"), ["ddp"], list(NORMS))
    record = EquivalenceRecord.from_json(report)
    found = {c.norm: c for c in record.causes}
    assert set(found) == set(NORMS)
    assert found["groupnorm"].launched < found["batchnorm"].launched
    assert found["groupnorm"].launched < 2 * found["groupnorm"].resample
    assert found["groupnorm"].split < found["batchnorm"].split
    assert record.strategies["ddp-w2-b4-s0"].step_distance == found["batchnorm"].launched
    assert list(record.strategies) == ["ddp-w2-b4-s0"]  # the ablation's steps: in `causes` only


@functools.cache
def demo_config() -> schema.Config:
    return small_config(Path("data"))


def made_run(strategy: str, workers: int, per_worker: int, norm: str, seed: int, ap: float) -> RunDir:
    entry = {"strategy": strategy, "workers": workers, "images_per_worker": per_worker, "norm": norm}
    run = sweep.fill(entry, demo_config()).replace(seed=seed)
    summary = RunSummary.from_json({"run_id": sweep.run_id(run), "entry": sweep.entry_id(run),
                                    "strategy": strategy, "variant": "", "workers": workers,
                                    "images_per_worker": per_worker, "seed": seed, "status": "ok",
                                    "run": run.to_json()})
    return RunDir(summary, "ok", metrics=Metrics(AP=ap), evaluated=True)


def ablation(single_bn, ddp_bn, single_gn, ddp_gn) -> list[RunDir]:
    made = []
    for norm, single, ddp in (("batchnorm", single_bn, ddp_bn), ("groupnorm", single_gn, ddp_gn)):
        made += [made_run("single", 1, 8, norm, s, ap) for s, ap in enumerate(single)]
        made += [made_run("ddp", 2, 4, norm, s, ap) for s, ap in enumerate(ddp)]
    return made


ISSUE_BN = ([0.097, 0.098, 0.099], [0.075, 0.081, 0.087])  # the gap of issue 48


@pytest.mark.parametrize("single_gn, ddp_gn, verdict", [
    ([0.060, 0.062, 0.064], [0.059, 0.063, 0.061], "supported"),
    ([0.080, 0.081, 0.082], [0.064, 0.065, 0.066], "not the whole cause"),
    ([0.061], [0.060], "undecided"),
])
def test_the_cause_test_says_what_the_runs_support(single_gn, ddp_gn, verdict):
    runs = ablation(*ISSUE_BN, single_gn, ddp_gn)
    main, ablated = causes.split_by_norm(runs)
    assert {causes.norm_of(r) for r in main} == {"batchnorm"} and len(ablated) == len(single_gn) * 2
    (test,) = causes.cause_tests(runs)
    assert (test.baseline, test.compared) == ("single-w1-b8", "ddp-w2-b4")
    assert test.verdict == verdict and test.supported == (verdict == "supported")
    assert test.ap_gap_with == pytest.approx(0.017)
    text = causes.sentence(test)
    if verdict == "supported":
        assert test.interval_without[0] <= 0 <= test.interval_without[1]
        assert "support BatchNorm's per-worker batch statistics as the cause" in text
    else:
        assert "hypothesis" in text and "support" not in text.split(":")[-1].replace("supported", "")


def test_without_the_ablation_runs_there_is_no_cause_test_and_no_section():
    runs = ablation(*ISSUE_BN, [], [])
    assert causes.cause_tests(runs) == [] and causes.section([], None) is None
    assert causes.split_by_norm(runs) == (runs, [])


def test_the_demo_sweep_trains_single_and_ddp_w2_under_groupnorm_at_their_seeds():
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    runs = sweep.runs(cfg)

    def seeds(entry: str) -> set[int]:
        return {r.seed for r in runs.values() if sweep.entry_id(r) == entry}

    for entry in ("single-w1-b8", "ddp-w2-b4"):
        assert seeds(f"{entry}-groupnorm") == seeds(entry) and len(seeds(entry)) >= 3
    assert sweep.swept_norms(cfg) == list(NORMS)


@pytest.mark.parametrize("single_gn, ddp_gn, supported", [
    ([0.060, 0.062, 0.064], [0.059, 0.063, 0.061], True),
    ([0.080, 0.081, 0.082], [0.064, 0.065, 0.066], False),
    ([0.061], [0.060], None),
])
def test_the_verdict_reads_the_ablations_finding(single_gn, ddp_gn, supported):
    """What the ablation's runs found is what the verdict's accuracy sentence says: the cause
    supported, not the whole cause, or (one run a side) still a hypothesis."""
    found = causes.finding(causes.cause_tests(ablation(*ISSUE_BN, single_gn, ddp_gn)))
    assert found.supported is supported and "GroupNorm" in found.cause
    assert found.finding.startswith("single's AP lead is +0.0170 with it")
    assert ("without it (95% interval" in found.finding) == (supported is not None)
    summary = summary_of({"single-w1-b8": SINGLE, "ddp-w2-b4": DDP, "zero-w2-b4": ZERO}, {
        "single-w1-b8": ISSUE_BN[0], "ddp-w2-b4": ISSUE_BN[1], "zero-w2-b4": ISSUE_BN[1]})
    text = verdict(VerdictInput(summary, comparisons(summary, COMPARED), accuracy_cause=found)).text
    expected = {True: "supports it", False: "does not support it", None: "cannot decide it"}
    assert f"{found.cause} {expected[supported]}" in text or (
        supported is None and f"runs that tested {found.cause} cannot decide it" in text), text
    assert ("remain hypotheses" in text) == (supported is None)
