"""The documentation's detection commands (tests/test_docs.py): the checkpoint their `ckpt=` gets, trained by
tests/docs_fixtures.py with its small sizes, and which commands they are."""

CHECKPOINT = ["experiment=shapes_det", "data.image_size=64", "model.head_channels=64"]
PAGES = ("docs/detection.md",)  # every command of these pages gets it
PATH_HINTS = ()  # and every ckpt= path naming one of these
