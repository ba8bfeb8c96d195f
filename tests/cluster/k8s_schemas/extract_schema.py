"""Write the OpenAPI schema of a CustomResourceDefinition as the JSON file the manifest tests validate against.

    python tests/cluster/k8s_schemas/extract_schema.py CRD.yaml OUT.json SOURCE_URL

Keeps the `openAPIV3Schema` of the CRD's served version, without `description` texts (they are
most of the file's size and no part of validation), and records where it came from under `$comment`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def without_descriptions(node: object) -> object:
    """`node` with every `description` key removed, recursively."""
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def extract(crd: dict, source: str) -> dict:
    """The served version's schema, with apiVersion/kind and source recorded."""
    served = [v for v in crd["spec"]["versions"] if v.get("served")]
    if len(served) != 1:
        raise ValueError(f"expected one served version, found {[v['name'] for v in served]}")
    schema = without_descriptions(served[0]["schema"]["openAPIV3Schema"])
    return {
        "$comment": f"openAPIV3Schema of {source}, descriptions removed (extract_schema.py)",
        "x-synctrain-apiVersion": f"{crd['spec']['group']}/{served[0]['name']}",
        "x-synctrain-kind": crd["spec"]["names"]["kind"],
        **schema,
    }


def main() -> None:
    """Read the CRD, write the schema."""
    crd_path, out_path, source = sys.argv[1:4]
    crd = yaml.safe_load(Path(crd_path).read_text())
    Path(out_path).write_text(json.dumps(extract(crd, source), sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
