"""The `logger` config group: every option and a list of several compose and validate; bad values fail early."""
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
    (["logger=mlflow"], ["mlflow"]),
    (["logger=wandb"], ["wandb"]),
    (["logger=csv"], ["csv"]),
    (["logger=[tensorboard,mlflow]"], ["tensorboard", "mlflow"]),
    (["logger=[tensorboard,mlflow,wandb,csv]"], ["tensorboard", "mlflow", "wandb", "csv"]),
    (["logger=[]"], []),
])
def test_logger_options_and_lists_compose(overrides: list[str], enabled: list[str]) -> None:
    assert _validate(*overrides).logger.enabled() == enabled


def test_tracker_settings_are_overridable_and_typos_are_refused() -> None:
    cfg = _validate("logger=[mlflow,wandb]", "logger.mlflow.experiment=cifar", "logger.mlflow.log_best_checkpoint=true",
                    "logger.wandb.mode=offline")
    assert (cfg.logger.mlflow.experiment, cfg.logger.mlflow.log_best_checkpoint) == ("cifar", True)
    assert cfg.logger.wandb.mode == "offline"
    with pytest.raises(ConfigCompositionException, match="experimant"):
        _validate("logger=mlflow", "logger.mlflow.experimant=x")
    with pytest.raises(ValueError, match="logger.wandb.mode must be one of"):
        _validate("logger=wandb", "logger.wandb.mode=cloud")
    with pytest.raises(ValueError, match="would overwrite the run's metrics.jsonl"):
        _validate("logger=csv", "logger.csv.filename=metrics.jsonl")
    with pytest.raises(ConfigCompositionException, match="comet"):
        _validate("logger=comet")


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
