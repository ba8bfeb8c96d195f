"""The oldest supported PyTorch (2.11 / torchvision 0.26, a GPU node's) in `make test`, without installing it:
every torch.* / torchvision.* name (and keyword argument passed to one) that src/, scripts/, the entry points
and the files `make gpu-check` runs use exists in the snapshot of that PyTorch (tests/oldest_torch_api.txt, written by `make test-compat`), or
the code copes with it missing (scripts/torch_api_names.py says what counts)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "oldest_torch_api.txt"
sys.path.insert(0, str(REPO / "scripts"))
import torch_api_names as api  # noqa: E402 - scripts/ is no package


def test_the_code_uses_only_names_the_oldest_pytorch_has():
    version, snapshot = api.read_snapshot(SNAPSHOT)
    problems = api.lacking(api.uses(), snapshot, api.resolves)
    assert not problems, (
        f"names that {version} lacks, or that its snapshot ({SNAPSHOT.relative_to(REPO)}) does not know, used "
        "where the code does not cope with them missing:\n  " + "\n  ".join(problems) + "\nFall back where the "
        "name is missing (getattr(X, 'name', None), `if hasattr(...)`, try/except AttributeError or ImportError, "
        "or a test of torch.__version__); for a name the snapshot does not know, run `make test-compat`, which "
        "rewrites the snapshot with that PyTorch.")


# A snapshot of a PyTorch that has torch.distributed but no torch.distributed.set_timeout, and DDP without its
# forward_sync_buffers= argument; a running one that has them (torch.ops.mine.op: missing in both, a namespace
# filled at run time).
DDP = "torch.nn.parallel.DistributedDataParallel"
SNAPSHOT_LACKING = {"torch.distributed": True, "torch.distributed.set_timeout": False, "torch.nn": True,
                    "torch.ops": True, "torch.ops.mine": True, "torch.ops.mine.op": False, "torch.nn.parallel": True,
                    DDP: True, f"{DDP}(forward_sync_buffers=)": False}
HERE = {"torch.distributed", "torch.distributed.set_timeout", "torch.nn", "torch.nn.Brand", "torch.ops",
        "torch.ops.mine", "torch.nn.parallel", DDP, f"{DDP}(forward_sync_buffers=)"}
GUARDED = {
    "getattr with a default": "import torch.distributed as d\nf = getattr(d, 'set_timeout', None)\n",
    "if hasattr": "import torch\nif hasattr(torch.distributed, 'set_timeout'):\n    torch.distributed.set_timeout(1)\n",
    "else of if not hasattr": "from torch import distributed as d\nif not hasattr(d, 'set_timeout'):\n    pass\n"
                              "else:\n    d.set_timeout(1)\n",
    "hasattr and": "import torch\nok = hasattr(torch.distributed, 'set_timeout') and torch.distributed.set_timeout(1)\n",
    "a module-level flag": "import torch\nHAS = hasattr(torch.distributed, 'set_timeout')\n"
                           "def f():\n    if HAS:\n        torch.distributed.set_timeout(1)\n",
    "try/except AttributeError": "import torch\ntry:\n    torch.distributed.set_timeout(1)\n"
                                 "except (AttributeError, RuntimeError):\n    pass\n",
    "an import under except ImportError": "try:\n    from torch.distributed import set_timeout\n"
                                          "except ImportError:\n    set_timeout = None\n",
    "a version test": "import torch\nV = tuple(int(p) for p in torch.__version__.split('.')[:2])\n"
                      "if V >= (2, 13):\n    torch.distributed.set_timeout(1)\n",
    "skipif(not hasattr)": "import pytest, torch\n@pytest.mark.skipif(not hasattr(torch.distributed, 'set_timeout'), "
                           "reason='old')\ndef test_x():\n    torch.distributed.set_timeout(1)\n",
    "missing here too": "import torch\ntorch.ops.mine.op(1)\n",
    "a keyword argument under a signature test": "import inspect\nfrom torch.nn.parallel import DistributedDataParallel\n"
        "HAS = 'forward_sync_buffers' in inspect.signature(DistributedDataParallel.__init__).parameters\n"
        "def wrap(m):\n    if HAS:\n        return DistributedDataParallel(m, forward_sync_buffers=False)\n",
}
UNGUARDED = {
    "a plain call": ("import torch.distributed as torch_dist\ntorch_dist.set_timeout(1)\n",
                     "torch.distributed.set_timeout (missing there)"),
    "an import": ("from torch.distributed import set_timeout\n", "torch.distributed.set_timeout (missing there)"),
    "getattr without a default": ("import torch\ngetattr(torch.distributed, 'set_timeout')(1)\n",
                                  "torch.distributed.set_timeout (missing there)"),
    "the wrong branch": ("import torch\nif not hasattr(torch.distributed, 'set_timeout'):\n"
                         "    torch.distributed.set_timeout(1)\n", "torch.distributed.set_timeout (missing there)"),
    "a broad except": ("import torch\ntry:\n    torch.distributed.set_timeout(1)\nexcept Exception:\n    pass\n",
                       "torch.distributed.set_timeout (missing there)"),
    "a name the snapshot does not know": ("from torch import nn\nnn.Brand(3)\n", "torch.nn.Brand (not in the snapshot)"),
    "a keyword argument": ("import torch.nn.parallel as par\npar.DistributedDataParallel(m, forward_sync_buffers=False)\n",
                           f"{DDP}(forward_sync_buffers=) (missing there)"),
}


def test_what_counts_as_coping_with_a_missing_name():
    """Each guarded form passes against a snapshot that lacks set_timeout; each unguarded one is named."""
    for what, source in GUARDED.items():
        assert api.lacking(api.source_uses(source, "x.py"), SNAPSHOT_LACKING, HERE.__contains__) == [], what
    for what, (source, problem) in UNGUARDED.items():
        found = api.lacking(api.source_uses(source, "x.py"), SNAPSHOT_LACKING, HERE.__contains__)
        assert len(found) == 1 and found[0].startswith("x.py:") and found[0].endswith(problem), (what, found)
