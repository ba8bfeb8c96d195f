"""The documentation's segmentation commands (tests/test_docs.py): the checkpoint their `ckpt=` gets, trained by
tests/docs_fixtures.py with its small sizes, and which commands they are."""

CHECKPOINT = ["experiment=shapes_seg_deeplabv3plus", "trainer.amp=none"]
PAGES = ("docs/segmentation.md",)  # every command of these pages gets it
PATH_HINTS = ("segment",)  # and every ckpt= path naming one of these
