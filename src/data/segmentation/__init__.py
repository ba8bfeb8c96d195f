"""Segmentation's part of the data layer: the ignore label and the (image, mask) adapter its datasets share
(masks.py), and the palette of mask PNGs (palette.py). Its datasets are src/data/datasets/{shapes_seg, voc,
cityscapes, segfolder}.py; the task itself is src/tasks/segmentation/."""
