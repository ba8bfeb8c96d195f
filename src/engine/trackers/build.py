"""The experiment trackers a run's `tracker` config asks for (TensorBoard excepted: the Tracker owns it)."""
from __future__ import annotations

from src.config.tracker import TrackerConfig
from src.engine.trackers.sink import Sink


def build_sinks(settings: TrackerConfig) -> list[Sink]:
    """MLflow, W&B and CSV sinks for the keys of `settings` that are set (their packages load on the tracker thread)."""
    sinks: list[Sink] = []
    if settings.mlflow is not None:
        from src.engine.trackers.mlflow_sink import MlflowSink

        sinks.append(MlflowSink(settings.mlflow))
    if settings.wandb is not None:
        from src.engine.trackers.wandb_sink import WandbSink

        sinks.append(WandbSink(settings.wandb))
    if settings.csv is not None:
        from src.engine.trackers.csv_sink import CsvSink

        sinks.append(CsvSink(settings.csv))
    return sinks
