"""The documentation's multi-label commands (tests/test_docs.py): the checkpoint their `ckpt=` gets, trained by
tests/docs_fixtures.py with its small sizes, and which commands they are."""

CHECKPOINT = ["experiment=shapes_multilabel"]
PAGES = ("docs/multilabel.md",)  # every command of these pages gets it
PATH_HINTS = ("multilabel",)  # and every ckpt= path naming one of these
