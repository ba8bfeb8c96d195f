"""Read a W&B offline run's history from its run-<id>.wandb file with wandb's own protobuf Record.

The file is W&B's transaction log: a 7-byte header (":W&B", magic 0xBEE1, version) then LevelDB log
format records (32 KiB blocks; each chunk: crc32 (4), length (2), type (1: full, 2: first, 3: middle,
4: last), payload), each record one serialized wandb_internal_pb2.Record.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


def read_records(path: Path) -> list[Any]:
    """Every Record of a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log (starts with {data[:7]!r})"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is zero padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        payload = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0:
            continue
        pending += payload
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """{run id: [history row, ...]} for every offline run under <run_dir>/wandb/ (W&B's own _keys removed)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")):
        run_id = path.stem.removeprefix("run-")
        for record in read_records(path):
            if record.WhichOneof("record_type") == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                out.setdefault(run_id, []).append({k: v for k, v in row.items() if not k.startswith("_")})
    return out
