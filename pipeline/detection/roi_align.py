"""The tiny model's RoIAlign, with its CPU backward spread over the process's threads.

torchvision's CPU kernel for roi_align's backward runs on one thread (every region scatters
into shared feature-map cells), and torch.profiler put it at 60 % of a demo iteration on two
cores. Channels never share cells: the backward here splits them over torch.get_num_threads()
threads, each running torchvision's own kernel on its slice, so the gradient is bit-identical to
torchvision's. The forward is torchvision's; off the CPU, or on one thread, the pooler is
torchvision's MultiScaleRoIAlign unchanged (and with FRCNN_BENCH_ROI_ALIGN=torchvision in the
environment: benchmarks/speed_cpu.py's "before" path).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
from torchvision.ops import MultiScaleRoIAlign, roi_align
from torchvision.ops.poolers import _convert_to_roi_format, _setup_scales

_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _POOLS:
        _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="roi-align-backward")
    return _POOLS[threads]


class ChannelThreadedRoIAlign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, feature, rois, output_size, spatial_scale, sampling_ratio):
        ctx.save_for_backward(rois)
        ctx.shape, ctx.dtype = feature.shape, feature.dtype
        ctx.args = (spatial_scale, output_size[0], output_size[1], sampling_ratio)
        return roi_align(feature, rois, output_size, spatial_scale, sampling_ratio, aligned=False)

    @staticmethod
    def backward(ctx, grad):
        (rois,) = ctx.saved_tensors
        batch, channels, height, width = ctx.shape
        scale, pooled_h, pooled_w, sampling = ctx.args
        grad, rois = grad.float(), rois.float()  # autocast ran the forward in fp32; so does its gradient
        threads = max(1, min(torch.get_num_threads(), channels))
        bounds = [(i * channels // threads, (i + 1) * channels // threads) for i in range(threads)]

        def part(bound):
            start, stop = bound
            return torch.ops.torchvision._roi_align_backward(
                grad[:, start:stop].contiguous(),
                rois,
                scale,
                pooled_h,
                pooled_w,
                batch,
                stop - start,
                height,
                width,
                sampling,
                False,
            )

        grad_feature = torch.cat(list(_pool(threads).map(part, bounds)), dim=1)
        return grad_feature.to(ctx.dtype), None, None, None, None


class ThreadedRoIPool(MultiScaleRoIAlign):
    """MultiScaleRoIAlign over one feature map, backward threaded on the CPU (see above)."""

    def forward(self, x, boxes, image_shapes):
        feature = x[self.featmap_names[0]]
        if (
            len(self.featmap_names) != 1
            or feature.device.type != "cpu"
            or os.environ.get("FRCNN_BENCH_ROI_ALIGN") == "torchvision"
            or torch.get_num_threads() == 1
            or not torch.is_grad_enabled()
        ):
            return super().forward(x, boxes, image_shapes)
        if self.scales is None:
            self.scales, self.map_levels = _setup_scales(
                [feature], image_shapes, self.canonical_scale, self.canonical_level
            )
        return ChannelThreadedRoIAlign.apply(
            feature, _convert_to_roi_format(boxes), self.output_size, self.scales[0], self.sampling_ratio
        )
