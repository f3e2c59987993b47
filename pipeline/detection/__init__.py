"""The detector and how it is scored.

model.py      torchvision's Faster R-CNN as params.yaml's model section builds it
roi_align.py  a threaded RoI pool for CPUs
scoring.py    predictions and COCO's twelve numbers (pycocotools or faster-coco-eval)
evaluate.py   the evaluate stage: a trained run scored on the validation split
split_probe.py  one gradient on 8 images against 4 + 4 and a resampling: each cause's share
"""
