"""What the multi-label datasets share in the data layer: their targets (a multi-hot float vector per image) and
multilabel_folder's labels.csv (labels_csv.py). The task itself is src/tasks/multilabel/."""
