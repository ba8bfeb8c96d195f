"""Experiment trackers behind the `tracker` config group: MLflow, W&B and CSV, fed on a background thread."""
