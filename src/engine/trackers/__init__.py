"""Experiment trackers behind the `logger` config group: MLflow, W&B and CSV, fed on a background thread."""
