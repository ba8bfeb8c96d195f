"""One module per dataset family (or one package: shapes/), each registering its names in
src.data.registry.DATASETS.

Every module in this folder and its packages is imported here, so adding a dataset is adding a file (and its
conf/data/<name>.yaml): no list to extend. Modules are imported in name order.
"""
from __future__ import annotations

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.walk_packages(__path__, prefix=f"{__name__}.")):
    importlib.import_module(_module)
