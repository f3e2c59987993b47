"""The images and their boxes, from where they come to the batches a process trains on.

synthetic.py   the embedded dataset the demo generates (COCO 2017 layout)
coco_fetch.py  COCO 2017 downloaded and checked (what dvc.yaml's stages run)
prepare.py     the data stage: either of the above, checked, and its manifest
tree.py        a tree's signature and identity: data that changed is noticed; no torch
errors.py      DatasetError, and the remedy every data error ends with
annotations.py COCO annotation files checked: the keys COCOeval reads, the splits' categories
images.py      images read as they are, or refused: each stored mode's rule, EXIF orientation
dataset.py     the training Dataset on those, and the data stage's check (build_manifest)
sampler.py     each process's shard of every batch, aspect-ratio grouped
"""
