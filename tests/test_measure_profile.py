"""pipeline/measure/profile.py: a torch.profiler trace summarised, on a real CPU trace of a few
tiny-model iterations made here, and on a hand-made timeline whose answer is known."""
from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pipeline.measure.profile import read_events, summarise
from pipeline.training.precision import Precision
from pipeline.training.train import forward_backward

from .test_speed import batch, model_cfg
from pipeline.detection.model import build_model


def test_a_timeline_with_known_gaps():
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "ts": 0, "dur": 100},
              {"ph": "X", "cat": "kernel", "name": "conv", "ts": 0, "dur": 30},
              {"ph": "X", "cat": "kernel", "name": "conv", "ts": 20, "dur": 20},  # overlaps
              {"ph": "X", "cat": "kernel", "name": "relu", "ts": 70, "dur": 10},
              {"ph": "X", "cat": "python_function", "name": "roi_heads.py(1): forward", "ts": 38, "dur": 40},
              {"ph": "X", "cat": "python_function", "name": "train.py(9): iterate", "ts": 0, "dur": 100},
              {"ph": "X", "cat": "cpu_op", "name": "aten::nonzero", "ts": 45, "dur": 20},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 90, "dur": 5}]
    found = summarise(events)
    assert found.device == "kernels" and found.steps == 1 and found.window_ms == 0.1
    assert found.busy_share == pytest.approx(0.5)  # 0-40 and 70-80 of 0-100
    assert [(g.start_ms, g.ms) for g in found.gaps] == [(0.04, 0.03), (0.08, 0.02)]
    # the innermost frame that covers the first gap, and the op in it
    assert found.gaps[0].frames[0] == "roi_heads.py(1): forward"
    assert found.gaps[0].ops[0] == ("aten::nonzero", 0.02)
    assert set(found.syncs) == {"aten::nonzero", "cudaStreamSynchronize"}
    assert [(t["name"], t["count"]) for t in found.top] == [("conv", 2), ("relu", 1)]


def test_a_real_cpu_trace_of_the_tiny_model(tmp_path):
    torch.manual_seed(0)
    model = build_model(model_cfg("tiny"), num_classes=4).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    precision = Precision("fp32", torch.device("cpu"))
    forward_backward(model, optimizer, *batch(), precision)  # warm-up, outside the trace
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for step in range(3):
            with record_function(f"ProfilerStep#{step}"):
                forward_backward(model, optimizer, *batch(step), precision)
                optimizer.step()
    trace = tmp_path / "trace.json.gz"
    prof.export_chrome_trace(str(trace))
    found = summarise(read_events(trace))
    print(found.markdown())
    assert found.steps == 3 and found.device.startswith("cpu ops")
    assert 0.2 < found.busy_share < 1
    assert found.gaps and [g.ms for g in found.gaps] == sorted((g.ms for g in found.gaps), reverse=True)
    assert any(g.frames for g in found.gaps)  # Python frames behind the host's gaps
    # torchvision's detection heads read values on the host: nonzero (torch.where) at least
    assert "aten::nonzero" in found.syncs and found.syncs["aten::nonzero"]["count"] >= 3
    assert found.top and all(0 < t["share"] <= 1 for t in found.top)
    assert json.loads(json.dumps(found.to_json()))["steps"] == 3


def test_a_trace_too_large_to_bring_back_is_slimmed_of_its_shortest_frames(tmp_path):
    import gzip
    from pipeline.measure.profile import slim
    events = [{"ph": "X", "cat": "python_function", "name": f"f{i}.py(1): g", "ts": i, "dur": 1 + i % 50}
              for i in range(20000)] + [{"ph": "X", "cat": "kernel", "name": "conv", "ts": 0, "dur": 5}]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    before = path.stat().st_size
    said = slim(path, before // 4)
    assert path.stat().st_size <= before // 4 and "shorter than" in said
    kept = read_events(path)
    assert any(e["cat"] == "kernel" for e in kept)  # the device's events stay whole
    assert all(e["dur"] >= 10 for e in kept if e["cat"] == "python_function")
