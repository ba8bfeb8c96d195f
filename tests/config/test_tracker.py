"""The `tracker` config group: every option and a list of several compose and validate; bad values fail early."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from src.config import validate_config
from src.engine.trackers.wandb_sink import resolve_mode

CONF = Path(__file__).resolve().parents[2] / "conf"


def _validate(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return validate_config(compose("train", overrides=list(overrides)))


@pytest.mark.parametrize("overrides,enabled", [
    ([], ["tensorboard"]),
    (["tracker=mlflow"], ["mlflow"]),
    (["tracker=wandb"], ["wandb"]),
    (["tracker=csv"], ["csv"]),
    (["tracker=[tensorboard,mlflow]"], ["tensorboard", "mlflow"]),
    (["tracker=[tensorboard,mlflow,wandb,csv]"], ["tensorboard", "mlflow", "wandb", "csv"]),
    (["tracker=[]"], []),
])
def test_tracker_options_and_lists_compose(overrides: list[str], enabled: list[str]) -> None:
    assert _validate(*overrides).tracker.enabled() == enabled


def test_tracker_settings_are_overridable_and_typos_are_refused() -> None:
    cfg = _validate("tracker=[mlflow,wandb]", "tracker.mlflow.experiment=cifar",
                    "tracker.mlflow.log_best_checkpoint=true", "tracker.wandb.mode=offline")
    assert (cfg.tracker.mlflow.experiment, cfg.tracker.mlflow.log_best_checkpoint) == ("cifar", True)
    assert cfg.tracker.wandb.mode == "offline"
    with pytest.raises(ConfigCompositionException, match="experimant"):
        _validate("tracker=mlflow", "tracker.mlflow.experimant=x")
    with pytest.raises(ValueError, match="tracker.wandb.mode must be one of"):
        _validate("tracker=wandb", "tracker.wandb.mode=cloud")
    with pytest.raises(ValueError, match="would overwrite the run's metrics.jsonl"):
        _validate("tracker=csv", "tracker.csv.filename=metrics.jsonl")
    with pytest.raises(ConfigCompositionException, match="comet"):
        _validate("tracker=comet")


def test_wandb_is_offline_without_credentials_and_wandb_mode_wins(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    assert resolve_mode("auto") == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (tmp_path / "netrc").chmod(0o600)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert resolve_mode("auto") == "online"
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode("auto") == "online"
    assert resolve_mode("offline") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode("auto") is None  # wandb.init reads WANDB_MODE itself
