"""A user's mistake is one message (src/commands/user_errors.py, src/commands/command_line.py): the commands as
users run them print `error: <message>` once and exit 2 with no traceback; the command line gets "did you mean";
ranks other than 0 stay silent when rank 0 said the same; the message reaches the run's log file. torchrun's side
is tests/commands/test_train.py's test_bad_config_fails_on_every_rank_before_any_process_group.

The commands run in processes forked from one that imported the libraries once (tests/docs_runner.py), so each
costs about a second rather than an interpreter's start-up.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from torchvision import datasets

from src import process_group
from src.commands import user_errors
from src.commands.command_line import CONF_DIR, find_mistake
from src.commands.user_errors import exit_on_user_error, reported
from src.config import config_dict, data_config, validate_config
from src.data.datasets.cifar import build_cifar
from src.engine.checkpoint.state import load_model_weights
from src.errors import USER_ERROR_EXIT_CODE, MissingFileError, UserError, closest_name
from src.logger import setup_logging
from src.models import build_model
from tests.docs_runner import DocsRunner

TIMEOUT_S = 300


def _mistakes(ckpt: str) -> list[tuple[str, list[str], str]]:
    """(script, its arguments, what the one line says) for each kind of mistake that ends before a run dir."""
    cases = [
        ("train.py", ["model=resnet21"],
         "model=resnet21: model has no option 'resnet21'; did you mean model=resnet20?"),
        ("train.py", ["trainer.max_step=5"], "trainer.max_step=5: trainer has no key 'max_step'; did you mean "
                                             "trainer.max_steps=5?"),
        # A checkpoint of another model: the one setting that differs, named once on each side.
        ("evaluate.py", [f"ckpt={ckpt}", "+model.name=resnet32"],
         "the checkpoint was trained with model.name=resnet20; this run has model.name=resnet32."),
    ]
    if not torch.cuda.is_available():
        cases.append(("train.py", ["device=cuda"], "device=cuda: PyTorch sees no GPU here ("))
    return cases


def test_each_mistake_is_one_line_with_exit_code_2(user_runner: DocsRunner, trained_cls_run: Path,
                                                   tmp_path: Path) -> None:
    for script, args, expected in _mistakes(str(trained_cls_run / "checkpoints" / "last.pt")):
        result = user_runner.run(script, args, tmp_path, TIMEOUT_S)
        assert result.returncode == USER_ERROR_EXIT_CODE, (script, args, result.output[-3000:])
        assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output[-3000:]
        assert expected in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("config,argv,expected", [
    ("train", ["norm=sync_bn"], "norm=sync_bn: norm has no option 'sync_bn'; did you mean norm=syncbn? (the options "
                                "are bn, frozen_bn, gn, syncbn, torch_syncbn)"),
    ("train", ["-m", "tracker=[tensorboard,mlfow]"], "did you mean tracker=mlflow?"),
    ("train", ["model=resnet20,resnet56"], "gives several values: add -m"),
    ("train", ["optim.lr=abc"], "optim.lr=abc: Value 'abc' of type 'str' could not be converted to Float"),
    ("train", ["trainr.epochs=3"], "train.py has no setting or config group 'trainr'; did you mean trainer.epochs=3?"),
    ("train", ["trainer.lr=0.1"], "trainer has no key 'lr'; did you mean optim.lr=0.1?"),  # the key of another group
    ("train", ["trainer.early_stop.metrc=top1"], "did you mean trainer.early_stop.metric=top1?"),
    ("train", ["model.kwargs.drop=0.1"], "add one with a leading +: +model.kwargs.drop=0.1"),
    ("train", ["+trainer.epochs=3"], "trainer.epochs exists already; set it without the +: trainer.epochs=3"),
    ("train", ["epochs"], "epochs: not an override (missing EQUAL at '<EOF>')"),
    ("train", ["logger=csv"], "the trackers' config group is now `tracker`"),
    ("evaluate", ["data.val_size=5"], "data has no entry 'val_size' yet; add one with a leading +: +data.val_size=5"),
    ("export", ["formt=onnx"], "export.py has no setting or config group 'formt'; did you mean format=onnx?"),
    ("predict", ["topk=many"], "topk=many: Value 'many' of type 'str' could not be converted to Integer"),
])
def test_the_command_line_is_checked_before_hydra(config: str, argv: list[str], expected: str) -> None:
    schema = {"train": "src.config", "predict": "src.commands.predict"}.get(config)
    with pytest.raises(UserError) as raised:
        find_mistake(config, schema, argv, CONF_DIR)
    assert expected in str(raised.value)


def test_a_valid_command_line_passes() -> None:
    find_mistake("train", "src.config", ["model=resnet56", "norm=bn", "optim.lr=0.05", "trainer.max_steps=5",
                                         "+model.kwargs.x=1", "~experiment", "hydra.run.dir=x", "seed=3"], CONF_DIR)
    find_mistake("train", "src.config", ["-m", "model=resnet20,resnet56", "tracker=[csv,tensorboard]"], CONF_DIR)
    find_mistake("evaluate", None, ["ckpt=x.pt", "+data.val_size=5", "trainer.num_threads=1"], CONF_DIR)
    find_mistake("train", "src.config", ["--config-dir", "elsewhere", "model=my_own"], CONF_DIR)  # Hydra's to judge


def test_closest_name_is_a_few_edits_away() -> None:
    assert closest_name("resnet21", ["resnet32", "resnet20", "resnet18"]) == "resnet20"  # fewest edits
    assert closest_name("resnet21", ["resnet11", "resnet20"]) == "resnet20"  # as few: the longer common prefix
    assert closest_name("max_step", ["max_steps", "epochs"]) == "max_steps"
    assert closest_name("val_size", ["eval_batch_size", "root"]) is None  # shares letters, but not a typo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def agent_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[dist.TCPStore]:
    """A store served as torchrun's agent serves one, and the variables torchrun gives its workers."""
    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=10))
    for key, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "TORCHELASTIC_RUN_ID": "test", "TORCHELASTIC_RESTART_COUNT": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(user_errors.FULL_ERROR_ENV, raising=False)
    yield store


def _exit_code(err: UserError, **kwargs: bool) -> object:
    with pytest.raises(SystemExit) as stop:
        exit_on_user_error(err, **kwargs)
    return stop.value.code


def test_another_rank_prints_only_what_rank_zero_did_not(agent_store: dist.TCPStore, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "0")
    assert _exit_code(UserError("data.root=/x: not found")) == USER_ERROR_EXIT_CODE
    assert capsys.readouterr().err == "error: data.root=/x: not found\n"
    monkeypatch.setenv("RANK", "1")
    assert _exit_code(UserError("data.root=/x: not found")) == USER_ERROR_EXIT_CODE  # rank 0 said it: silent
    monkeypatch.setattr(user_errors, "RANK0_WAIT_S", 0.2)
    assert _exit_code(UserError("a mistake only rank 1 sees")) == USER_ERROR_EXIT_CODE  # printed after the wait
    monkeypatch.setenv("RANK", "2")
    assert _exit_code(UserError("a mistake only rank 1 sees")) == USER_ERROR_EXIT_CODE  # rank 1 printed it: silent
    assert _exit_code(UserError("the command line's mistake"), same_on_every_rank=True) == USER_ERROR_EXIT_CODE
    assert capsys.readouterr().err == "error (rank 1): a mistake only rank 1 sees\n"


def test_a_rank_that_torchrun_stops_while_it_waits_prints_its_mistake(
        agent_store: dist.TCPStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0 failed in a collective because this rank left it: torchrun's SIGTERM must not swallow the cause."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(user_errors, "RANK0_WAIT_S", 60.0)
    previous = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    started = time.monotonic()
    timer.start()
    try:
        assert _exit_code(UserError("cannot read image bee/1.jpg")) == USER_ERROR_EXIT_CODE
    finally:
        timer.cancel()
    assert time.monotonic() - started < 30
    assert capsys.readouterr().err == "error (rank 1): cannot read image bee/1.jpg\n"
    assert signal.getsignal(signal.SIGTERM) is previous  # restored


def test_reported_mistakes_reach_the_log_and_program_errors_keep_their_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        restores_process_state: None) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(user_errors.FULL_ERROR_ENV, raising=False)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))  # as torchrun sets it
    setup_logging(tmp_path, 0)
    try:
        def mistake() -> None:
            raise MissingFileError("data.root=/nonexistent: no such folder")

        def bug() -> None:
            raise RuntimeError("a program error")

        with pytest.raises(SystemExit) as stop:
            reported(mistake)()
        assert stop.value.code == USER_ERROR_EXIT_CODE
        assert capfd.readouterr().err == "error: data.root=/nonexistent: no such folder\n"
        assert not (tmp_path / "error.json").exists()  # torchrun's summary shows no traceback for a mistake
        with pytest.raises(RuntimeError, match="a program error"):
            reported(bug)()
        recorded = json.loads((tmp_path / "error.json").read_text())["message"]
        assert "RuntimeError: a program error" in recorded["message"]
        assert "in bug" in recorded["extraInfo"]["py_callstack"]
        monkeypatch.setenv(user_errors.FULL_ERROR_ENV, "1")  # asked for: the traceback, the same exit code
        with pytest.raises(SystemExit) as stop:
            reported(mistake)()
        assert stop.value.code == USER_ERROR_EXIT_CODE and "in mistake" in capfd.readouterr().err
    finally:
        logging.shutdown()
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert log.count("ERROR [rank 0] src.logger: data.root=/nonexistent: no such folder") == 2  # each mistake
    assert "ERROR [rank 0] src.logger: the command failed with a program error" in log  # and its traceback:
    assert "RuntimeError: a program error" in log and log.count("Traceback") == 2  # the bug's, the asked-for one


def test_ctrl_c_outside_training_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C during a build, an evaluation or a prediction: no KeyboardInterrupt traceback, the shell's code."""
    monkeypatch.delenv("RANK", raising=False)

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        reported(interrupted)()
    assert stop.value.code == user_errors.INTERRUPTED_EXIT_CODE == 130
    assert capfd.readouterr().err == "interrupted (Ctrl-C)\n"


def test_an_unreadable_image_from_a_loader_worker_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    """A corrupt file in the user's data is their mistake; from a DataLoader worker it arrives wrapped in the
    worker's traceback (torch's ExceptionWrapper), of which only the message is printed."""
    from torch._utils import ExceptionWrapper

    from src.data.image_files import UnreadableImage

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(user_errors.FULL_ERROR_ENV, raising=False)
    try:
        raise UnreadableImage.of("/data/train/ant/1.jpg", "image file is truncated", where="training split, sample 1")
    except UnreadableImage:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")

    def training() -> None:
        wrapped.reraise()

    with pytest.raises(SystemExit) as stop:
        reported(training)()
    assert stop.value.code == USER_ERROR_EXIT_CODE
    assert capfd.readouterr().err == ("error: cannot read image /data/train/ant/1.jpg (training split, sample 1): "
                                      "image file is truncated\n")


def test_cuda_without_a_gpu_is_a_mistake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"device=cuda: PyTorch sees no GPU here \(.*\); use device=cpu"):
        process_group.select_device("cuda")


def _config(model: str):  # noqa: ANN202 - a TrainConfig
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return validate_config(compose("train", overrides=[f"model={model}", "norm=bn"]))


def test_a_checkpoint_of_another_model_names_only_what_differs() -> None:
    trained, other = _config("resnet20"), _config("resnet32")
    weights = build_model(trained.model, trained.norm, 6).state_dict()
    with pytest.raises(UserError) as raised:
        load_model_weights(build_model(other.model, other.norm, 6), weights, config_dict(trained), config_dict(other),
                           "last.pt")
    message = str(raised.value)
    assert ("the weights in last.pt do not fit this model: the checkpoint was trained with model.name=resnet20; "
            "this run has model.name=resnet32. Use the checkpoint's settings") in message
    assert message.count("model.") == 2 and "layer" not in message
    # Same settings, other class count (another data folder): the tensors say it.
    with pytest.raises(UserError, match=r"2 tensor\(s\) of another shape \(e.g. fc.weight: \(6, 64\) in the "
                                        r"checkpoint, \(10, 64\) here\)"):
        load_model_weights(build_model(trained.model, trained.norm, 10), weights, config_dict(trained),
                           config_dict(trained), "last.pt")


def test_a_failed_download_names_the_dataset_the_url_and_the_folder(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{_free_port()}/cifar-10-python.tar.gz"  # nothing listens: refused, as offline
    monkeypatch.setattr(datasets.CIFAR10, "url", url)
    with pytest.raises(UserError) as raised:
        build_cifar(data_config(name="cifar10", root=str(tmp_path), download=True))
    message = str(raised.value)
    assert f"downloading cifar10 from {url} failed" in message
    assert f"put it in {tmp_path} " in message and f"{tmp_path / 'cifar-10-batches-py'}" in message

