"""The documentation's instance-segmentation commands (tests/test_docs.py): the checkpoint their `ckpt=` gets,
trained by tests/docs_fixtures.py with its small sizes, and which commands they are."""

CHECKPOINT = ["experiment=shapes_inst", "data.image_size=48", "model.head_channels=32"]
PAGES = ("docs/instance_segmentation.md",)  # every command of these pages gets it
PATH_HINTS = ()  # and every ckpt= path naming one of these
