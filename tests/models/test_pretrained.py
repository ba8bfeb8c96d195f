"""Pretrained weights by name, through each library's cache: torchvision's weights enums (TORCH_HOME) and
timm's pretrained configs (the Hugging Face hub cache). Each test writes a weights file of the real
architecture, with random values, where the library looks for it, loads it by name with the network
blocked, and checks every tensor landed; a missing file is an error naming the exact path."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest
import torch
from safetensors.torch import save_file

from src.models import build_model
from src.models.config import model_config
from src.models.pretrained import is_weights_name

BN = {"name": "bn"}
TIMM_ARCH = "mobilenetv3_small_050"  # 1.6M parameters: the smallest timm model with hub weights we need
TIMM_REPO = "timm/mobilenetv3_small_050.lamb_in1k"  # its default tag's hf_hub_id (timm's pretrained_cfg)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails at once: a cached file must be read without one."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network access attempted during the test")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """Empty TORCH_HOME and HF_HOME for this test."""
    torch_home, hf_home = tmp_path / "torch", tmp_path / "hf"
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    yield torch_home, hf_home


def _randomised(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state_dict with fresh random values (running variances positive), so a match is no accident."""
    g = torch.Generator().manual_seed(1234)
    out = {}
    for k, v in module.state_dict().items():
        if v.is_floating_point():
            out[k] = torch.rand(v.shape, generator=g) + 0.5 if "running_var" in k else torch.randn(v.shape, generator=g)
        else:
            out[k] = v.clone() + 3
    return out


def _torchvision_file(torch_home: Path, builder: str, name: str = "DEFAULT") -> dict[str, torch.Tensor]:
    """Write a random state_dict of torchvision's `builder` where torch.hub caches its weights enum's file."""
    from torchvision import models

    weights = models.get_model_weights(builder)[name]
    state = _randomised(models.get_model(builder, weights=None))
    path = torch_home / "hub" / "checkpoints" / weights.url.rsplit("/", 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


def _timm_file(hf_home: Path) -> dict[str, torch.Tensor]:
    """Write a random state_dict of the timm model into the hub cache layout huggingface_hub reads."""
    import timm

    state = _randomised(timm.create_model(TIMM_ARCH, pretrained=False))
    repo = hf_home / "hub" / f"models--{TIMM_REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(snapshot / "model.safetensors"))
    return state


def _assert_loaded(model: torch.nn.Module, state: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> int:
    own = model.state_dict()
    checked = 0
    for key, value in state.items():
        if key.startswith(skip):
            continue
        assert torch.equal(own[key], value), key
        checked += 1
    assert checked > 0
    return checked


@pytest.mark.parametrize("name", ["DEFAULT", "IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1"])
def test_torchvision_weights_by_name_from_torch_home(caches: tuple[Path, Path], no_network: None, name: str) -> None:
    state = _torchvision_file(caches[0], "resnet18")
    model = build_model({"name": "torchvision", "arch": "resnet18", "weights": name}, BN, 1000)
    assert _assert_loaded(model, state) == len(state)


def test_other_num_classes_keep_the_backbone_and_initialise_the_head(caches: tuple[Path, Path],
                                                                     no_network: None) -> None:
    state = _torchvision_file(caches[0], "mobilenet_v3_small")
    torch.manual_seed(0)
    model = build_model({"name": "torchvision", "arch": "mobilenet_v3_small", "weights": "DEFAULT"}, BN, 6)
    torch.manual_seed(0)
    scratch = build_model({"name": "torchvision", "arch": "mobilenet_v3_small"}, BN, 6)
    head = model.head_module_names[0]
    assert _assert_loaded(model, state, skip=(f"{head}.",)) == len(state) - 2
    assert model.state_dict()[f"{head}.weight"].shape[0] == 6
    assert torch.equal(model.state_dict()[f"{head}.weight"], scratch.state_dict()[f"{head}.weight"])


def test_our_imagenet_resnet_by_name(caches: tuple[Path, Path], no_network: None) -> None:
    state = _torchvision_file(caches[0], "resnet18")
    classifier = build_model({"name": "resnet18", "weights": "IMAGENET1K_V1"}, {"name": "syncbn"}, 1000)
    assert _assert_loaded(classifier, state) == len(state)


def test_timm_pretrained_from_the_hugging_face_cache(caches: tuple[Path, Path], no_network: None) -> None:
    state = _timm_file(caches[1])
    model = build_model({"name": "timm", "arch": TIMM_ARCH, "pretrained": True}, BN, 1000)
    assert _assert_loaded(model, state) == len(state)
    other = build_model({"name": "timm", "arch": TIMM_ARCH, "pretrained": True}, {"name": "syncbn"}, 6)
    assert _assert_loaded(other, state, skip=("classifier.",)) == len(state) - 2
    assert other.classifier.weight.shape[0] == 6


def test_weights_files_false_loads_nothing(caches: tuple[Path, Path], no_network: None) -> None:
    """evaluate / predict / resume build with weights_files=False (the checkpoint brings the weights): no file is
    read, even where one is in the cache, and a missing one is no error."""
    pretrained = [({"name": "timm", "arch": TIMM_ARCH, "pretrained": True}, "pretrained"),
                  ({"name": "torchvision", "arch": "resnet18", "weights": "DEFAULT"}, "weights")]
    for cfg, key in pretrained:  # nothing in the caches
        build_model(cfg, BN, 6, weights_files=False)
    files = [_timm_file(caches[1]), _torchvision_file(caches[0], "resnet18")]
    for (cfg, key), state in zip(pretrained, files):
        torch.manual_seed(0)
        model = build_model(cfg, BN, 6, weights_files=False).state_dict()
        torch.manual_seed(0)
        scratch = build_model({k: v for k, v in cfg.items() if k != key}, BN, 6).state_dict()
        assert model.keys() == scratch.keys() and all(torch.equal(model[k], scratch[k]) for k in model), cfg
        backbone = [k for k in state if k in model and state[k].is_floating_point()
                    and state[k].shape == model[k].shape]
        assert backbone and not any(torch.equal(model[k], state[k]) for k in backbone), f"{cfg}: a file was loaded"


def test_missing_file_offline_names_the_exact_cache_path(caches: tuple[Path, Path], no_network: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch_home, hf_home = caches
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE") as err:
        build_model({"name": "torchvision", "arch": "resnet18", "weights": "DEFAULT"}, BN, 6)
    assert str(torch_home / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in str(err.value)
    with pytest.raises(FileNotFoundError) as err:
        build_model({"name": "timm", "arch": TIMM_ARCH, "pretrained": True}, BN, 6)
    folder = hf_home / "hub" / f"models--{TIMM_REPO.replace('/', '--')}"
    assert f"{folder}/snapshots/<commit>/model.safetensors" in str(err.value)
    assert f"{folder}/refs/main" in str(err.value)


def test_offline_missing_file_fails_at_config_validation(caches: tuple[Path, Path], no_network: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any process group: validate_config runs ModelConfig.validate, which looks in the caches."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="resnet18-f37072fd.pth"):
        model_config(name="resnet18", weights="IMAGENET1K_V1").validate()
    with pytest.raises(FileNotFoundError, match="models--timm--mobilenetv3_small_050.lamb_in1k"):
        model_config(name="timm", arch=TIMM_ARCH, pretrained=True).validate()
    _torchvision_file(caches[0], "resnet18")
    _timm_file(caches[1])
    model_config(name="resnet18", weights="IMAGENET1K_V1").validate()
    model_config(name="timm", arch=TIMM_ARCH, pretrained=True).validate()
    model_config(name="timm", arch=TIMM_ARCH, pretrained=True).validate(check_files=False)


def test_checkpoint_of_a_pretrained_run_loads_without_the_cache(caches: tuple[Path, Path], no_network: None,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """evaluate.py / predict.py / export.py: the checkpoint holds the weights; the cache may be long gone."""
    from hydra import compose, initialize_config_dir

    import src.config  # noqa: F401
    from src.config import config_dict, validate_config
    from src.engine.checkpoint.files import atomic_write_bytes, serialize
    from src.engine.checkpoint.state import TrainState
    from src.commands.trained_run import load_trained_run
    from src.engine.optim import build_optimizer, build_scheduler

    _timm_file(caches[1])
    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = validate_config(compose("train", overrides=["model=timm", f"model.arch={TIMM_ARCH}",
                                                          "model.pretrained=true", "norm=bn", "data.num_classes=4"]))
    model = build_model(cfg.model, cfg.norm, 4)
    optimizer = build_optimizer(model, cfg.optim, cfg.data.batch_size)
    state = TrainState(model, optimizer, build_scheduler(optimizer, cfg.sched, 1, 1),
                       torch.amp.GradScaler("cpu", enabled=False), config=config_dict(cfg),
                       class_names=["a", "b", "c", "d"])
    atomic_write_bytes(serialize(state.state_dict()), tmp_path / "last.pt")
    import shutil

    shutil.rmtree(caches[1])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    trained = load_trained_run(tmp_path / "last.pt", device=torch.device("cpu"))
    _assert_loaded(trained.model, model.state_dict())


@pytest.mark.parametrize("kw, match", [
    (dict(name="torchvision", arch="resnet18", weights="IMAGENET1K_V2"), "DEFAULT, IMAGENET1K_V1"),
    (dict(name="torchvision", arch="resnet18", weights="ResNet50_Weights.IMAGENET1K_V2"), "not a weights name"),
    (dict(name="resnet20", weights="DEFAULT"), "no weights by name"),
    (dict(name="timm", arch="resnet18", weights="DEFAULT"), "model.pretrained=true"),
    (dict(name="torchvision", arch="resnet18", pretrained=True), "model.weights=DEFAULT"),
    (dict(name="timm", arch="resnet18", pretrained=True, backbone_weights="/w/r18.pth"), "keep one"),
])
def test_bad_names_are_refused_at_validation(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        model_config(**kw).validate()


def test_a_name_is_told_from_a_path() -> None:
    assert all(map(is_weights_name, ["DEFAULT", "IMAGENET1K_V2", "ResNet50_Weights.IMAGENET1K_V2"]))
    assert not any(map(is_weights_name, ["w.pth", "/w/DEFAULT", "resnet50-0676ba61.pth", "DEFAULT.pth", None]))
