"""The embedded shapes datasets: procedural images, deterministic from (seed, split, index), no files, no download.

drawing.py draws the images (and their masks and instances); datasets.py holds the torch Datasets over it and the
several-shapes scenes' options; each task's set is registered by its own module, named for the task
(classification.py registers `shapes`), so that a project without that task leaves its module out.
"""
