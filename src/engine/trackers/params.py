"""What trackers are told about a run besides metrics: the flattened config and the tags."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[3]


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"model.name": "resnet20", "optim.betas": "[0.9, 0.999]", ...}: nested keys joined by dots, values as text."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, f"{name}."))
        else:
            out[name] = "null" if value is None else str(value)
    return out


def git_commit(repo: Path = REPO) -> Optional[str]:
    """The commit of the code being run, or None outside a git checkout (a wheel, a Docker image without .git)."""
    try:
        result = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and len(commit) == 40 else None


def run_tags(config: dict[str, Any], world_size: int) -> dict[str, str]:
    """Tags every tracker run carries: world size, norm, model, data, and the git commit when there is one."""
    tags = {"world_size": str(world_size), "norm": str(config.get("norm", {}).get("name")),
            "model": str(config.get("model", {}).get("name")), "data": str(config.get("data", {}).get("name"))}
    commit = git_commit()
    if commit is not None:
        tags["git_commit"] = commit
    return tags
