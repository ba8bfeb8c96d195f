"""Multi-label classification through the commands, on a classification model name with everything it has: a
2-process SyncBN training (torchrun) of model=resnet18 with model.weights=DEFAULT (torchvision's file in the cache)
and activation checkpointing, then evaluate.py, predict.py and export.py on its checkpoint."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from src.data.datasets.shapes.multilabel import ShapesMultiLabel
from tests.models.test_pretrained import _torchvision_file
from tests.support.launch import REPO, launch, rows

KINDS = ["circle", "square", "triangle", "star", "cross", "ring"]
RUN = ["experiment=shapes_multilabel", "model=resnet18", "model.weights=DEFAULT", "norm=syncbn",
       "trainer.activation_checkpointing=true", "data.train_size=16", "data.val_size=11", "data.batch_size=4",
       "data.eval_batch_size=4", "trainer.epochs=1", "trainer.max_steps=2", "device=cpu", "trainer.num_threads=1",
       "trainer.progress_bar=false", "trainer.tensorboard=false"]


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(name, overrides=overrides)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread", "restores_process_state")  # the commands run in this process too
def test_a_classifier_trains_multilabel_and_every_command_reads_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # torchvision's resnet18 weights, here only
    _torchvision_file(tmp_path / "torch", "resnet18")
    run_dir = tmp_path / "run"
    result = launch(2, [*RUN, f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-4000:]
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "activation checkpointing: layer1, layer2, layer3, layer4" in log
    assert "tensors loaded from ResNet18_Weights.IMAGENET1K_V1; ignored: fc.bias, fc.weight" in log  # 6 classes
    (val,) = rows(run_dir, "val")
    assert {"map", "loss", *(f"ap_{k}" for k in KINDS)} <= set(val) and 0 < val["map"] <= 1
    ckpt = run_dir / "checkpoints" / "last.pt"

    from src.commands import evaluate, export, predict

    out = tmp_path / "metrics.json"
    evaluate.run(_compose("evaluate", [f"ckpt={ckpt}", f"out={out}", "device=cpu"]))
    measured = json.loads(out.read_text())
    assert measured["map"] == val["map"] and measured["ap_star"] == val["ap_star"]  # 1 process: the same bits

    inputs = tmp_path / "inputs"
    (inputs / "sub").mkdir(parents=True)
    scenes = ShapesMultiLabel(0, "val", 2, 48, 6)
    Image.fromarray(scenes.raw(0)[0]).save(inputs / "a.png")
    Image.fromarray(scenes.raw(1)[0]).save(inputs / "sub" / "b.jpg")
    predict.run(_compose("predict", [f"ckpt={ckpt}", f"input={inputs}", f"out={tmp_path / 'pred'}", "num_workers=0",
                                     "threshold=0.3"]))
    with open(tmp_path / "pred" / "predictions.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["file"] for r in table] == ["a.png", "sub/b.jpg"]  # the threshold's own test: test_predictions.py
    for r in table:
        probs = {k: float(r[f"prob_{k}"]) for k in KINDS}
        assert all(0 <= p <= 1 for p in probs.values())
        assert set(r["labels"].split()) == {k for k, p in probs.items() if p >= 0.3}

    model_file = tmp_path / "model.pt"
    export.run(_compose("export", [f"ckpt={ckpt}", "format=torchscript", f"out={model_file}"]))
    logits = torch.jit.load(str(model_file))(torch.randn(3, 3, 32, 32))
    assert logits.shape == (3, 6)
