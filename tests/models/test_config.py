"""Every conf/model and conf/norm file loads into the schema, validates, builds; bad configs fail clearly."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torchvision.models import get_model_weights

from src.data import DATASETS
from src.models import MODELS, ModelConfig, NormConfig, build_model, model_config, model_schema
from src.models.registry import IMAGE_LOGITS, ModelFamily, model_output
from src.tasks import model_tasks

CONF = Path(__file__).resolve().parents[2] / "conf"
MODEL_FILES = sorted((CONF / "model").glob("*.yaml"))
NORM_FILES = sorted((CONF / "norm").glob("*.yaml"))
# Forward passes only for the small networks; the big ones are built on the meta device and their
# parameter counts compared with torchvision's published numbers (exact integers).
SMALL = {"resnet20", "resnet32", "resnet44", "resnet56", "resnet110", "resnet18", "resnet50", "timm", "torchvision"}
# Architectures for the zoo names where a test builds them without a conf file.
ZOO_ARCH = {"timm": "resnet18", "torchvision": "mobilenet_v3_small"}


def load(schema: type, path: Path) -> object:
    """A yaml file merged into its structured schema, as Hydra does (unknown keys / wrong types raise)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(path)))


def test_required_options_exist() -> None:
    names = {p.stem for p in MODEL_FILES}
    required = {"resnet20", "resnet56", "resnet110", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}
    assert required <= names
    assert {p.stem for p in NORM_FILES} == {"bn", "syncbn", "torch_syncbn", "gn", "frozen_bn"}
    assert names == set(MODELS.names()) - {"resnet1202"}  # one file per registered name (1202: too big to ship)


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_model_yaml_validates(path: Path) -> None:
    """Every model file, whatever its task (each task's own build checks: tests/models/test_<its models>.py)."""
    cfg = load(model_schema(), path)
    assert cfg.name == path.stem  # file name = model name, so `model=<file>` reads as the model
    cfg.validate()


@pytest.mark.parametrize("path", [p for p in MODEL_FILES if model_output(p.stem) == IMAGE_LOGITS],
                         ids=lambda p: p.stem)
def test_classifier_yaml_builds(path: Path) -> None:
    cfg = load(model_schema(), path)
    if cfg.name in SMALL:
        model = build_model(cfg, NormConfig(), 10).eval()
        size = 32 if cfg.name in ("resnet20", "resnet32", "resnet44", "resnet56", "resnet110") else 48
        with torch.no_grad():
            assert model(torch.randn(2, 3, size, size + 8)).shape == (2, 10)
        return
    with torch.device("meta"):
        model = build_model(cfg, NormConfig(), 1000)
    count = sum(p.numel() for p in model.parameters())
    expected = get_model_weights(cfg.name).DEFAULT.meta["num_params"]
    assert count == expected, f"{cfg.name}: {count} parameters, torchvision says {expected}"


@pytest.mark.parametrize("path", NORM_FILES, ids=lambda p: p.stem)
def test_norm_yaml_validates(path: Path) -> None:
    cfg = load(NormConfig, path)
    assert cfg.name == path.stem
    cfg.validate(device=None)


def test_every_model_name_serves_a_task_by_its_family() -> None:
    """Each name has a family, which says what its models produce; every name serves at least one registered task,
    the same ones as the rest of its family; the classifiers here serve classification (and every other task that
    reads per-image logits)."""
    families: dict[str, set[tuple[str, ...]]] = {}
    for entry in MODELS:
        family = entry.info["family"]
        assert isinstance(family, ModelFamily) and model_tasks(entry.name), entry.name
        families.setdefault(family.name, set()).add(model_tasks(entry.name))
    assert all(len(tasks) == 1 for tasks in families.values()), families
    classifiers = {"resnet20", "resnet56", "resnet18", "resnet50", "timm", "torchvision"}
    assert all("classification" in model_tasks(n) for n in classifiers)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"name": "resnet21"}, "model.name must be one of"),
    ({"cifar_shortcut": "C"}, "model.cifar_shortcut must be A or B"),
    # A family's option on a model of another family: nothing would read it.
    ({"name": "resnet18", "cifar_shortcut": "B"}, "model.cifar_shortcut='B' is not read by model=resnet18: it is an "
                                                  "option of "),
    ({"weights": "/nonexistent/w.pth"}, "model.weights: no file at '/nonexistent/w.pth'"),
    ({"backbone_weights": "/nonexistent/b.pth"}, "model.backbone_weights: no file at"),
    ({"arch": "resnet50"}, "model.arch and model.kwargs apply only to model=timm / model=torchvision"),
    ({"kwargs": {"drop_rate": 0.1}}, "model.arch and model.kwargs apply only to"),
    ({"name": "timm"}, "model=timm needs model.arch=<architecture name>"),
    ({"name": "timm", "arch": "resnet5O"}, "model.arch='resnet5O' is not a timm classification model; close names: "
                                           "resnet50"),
    ({"name": "torchvision", "arch": "mobilenet_v3"}, "model.arch='mobilenet_v3' is not a torchvision classification "
                                                      "model; close names: .*mobilenet_v3_large"),
    ({"name": "torchvision", "arch": "fcn_resnet50"}, "is not a torchvision classification model"),
    ({"name": "timm", "arch": "resnet18", "kwargs": {"pretrained": True}},
     r"model.kwargs may not set \['pretrained'\]"),
    ({"name": "torchvision", "arch": "resnet18", "kwargs": {"num_classes": 3}}, "may not set .'num_classes'."),
])
def test_bad_model_config(overrides: dict, message: str) -> None:
    assert_refused(overrides, message)


def assert_refused(overrides: dict, message: str) -> None:
    """Config validation and build_model (from a mapping) both refuse `overrides` with `message` (also for a
    task's own models, whose test modules import it)."""
    with pytest.raises(ValueError, match=message):
        model_config(**overrides).validate()
    with pytest.raises(ValueError, match=message):  # build_model validates a mapping too
        build_model(overrides, {}, 10)


def test_weights_and_backbone_weights_exclusive(tmp_path: Path) -> None:
    f = tmp_path / "w.pth"
    torch.save({}, f)
    with pytest.raises(ValueError, match="model.weights .* and model.backbone_weights are both set"):
        ModelConfig(name="resnet18", weights=str(f), backbone_weights=str(f)).validate()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"name": "batchnorm"}, "norm.name must be one of bn, syncbn, torch_syncbn, gn, frozen_bn"),
    ({"eps": 0.0}, "norm.eps must be a positive number"),
    ({"momentum": 1.5}, r"norm.momentum must be in \[0, 1\] or null"),
    ({"num_groups": 0}, "norm.num_groups must be >= 1"),
    ({"group_size": 2}, "norm.group_size applies only to norm=syncbn"),
    ({"name": "torch_syncbn", "sync_every": 2}, "norm.sync_every applies only to norm=syncbn"),
    ({"name": "gn", "sync_until_step": 10}, "norm.sync_until_step applies only to norm=syncbn"),
    ({"name": "syncbn", "group_size": 0}, "norm.group_size must be an int >= 1, or null/None for all ranks"),
    ({"name": "syncbn", "sync_every": 0}, "norm.sync_every must be >= 1"),
    ({"name": "syncbn", "sync_until_step": -1}, "norm.sync_until_step must be >= 0 or null"),
])
def test_bad_norm_config(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NormConfig(**overrides).validate(device=None)


def test_group_size_must_divide_the_world_size() -> None:
    cfg = NormConfig(name="syncbn", group_size=3)
    cfg.validate(device=None)  # world size unknown (e.g. evaluation): not checked
    cfg.validate(device=None, world_size=6)
    with pytest.raises(ValueError, match=r"norm.group_size=3 must divide the number of processes \(4\) into groups of "
                                         r"consecutive ranks: use one of \[1, 2, 4\], or null/None for all ranks"):
        cfg.validate(device=None, world_size=4)


@pytest.mark.parametrize("key", ["eps", "momentum"])
def test_zoo_models_keep_their_own_eps_and_momentum(key: str) -> None:
    model = {"name": "torchvision", "arch": "mobilenet_v3_small"}
    built = build_model(model, {"name": "syncbn"}, 4)
    bns = [m for m in built.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert bns and all(m.eps == 1e-3 and m.momentum == 0.01 for m in bns)  # torchvision's MobileNetV3 values
    with pytest.raises(ValueError, match=f"norm.{key}=0.5 does not apply to model=torchvision: its BatchNorm layers "
                                         "keep the eps and momentum their architecture defines"):
        build_model(model, {"name": "syncbn", key: 0.5}, 4)
    build_model(model, {"name": "gn", "num_groups": 8, "eps": 0.5}, 4)  # GroupNorm has no architecture eps


def test_momentum_none_is_valid() -> None:
    NormConfig(momentum=None).validate()
    model = build_model({"name": "resnet20"}, {"momentum": None}, 10)
    assert all(m.momentum is None for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_torch_syncbn_refused_on_cpu() -> None:
    with pytest.raises(ValueError, match="norm=torch_syncbn needs CUDA GPUs and the NCCL backend; on CPU use "
                                         "norm=syncbn"):
        NormConfig(name="torch_syncbn").validate(device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="norm=torch_syncbn needs CUDA GPUs"):
            NormConfig(name="torch_syncbn").validate()


def test_unknown_keys_rejected() -> None:
    with pytest.raises(ValueError, match=r"unknown model config key\(s\) \['outputstride'\]"):
        build_model({"name": "resnet20", "outputstride": 8}, {}, 3)
    with pytest.raises(Exception, match="outputstride"):  # Hydra's schema merge rejects it as well
        OmegaConf.merge(OmegaConf.structured(model_schema()), {"outputstride": 8})


def test_accepts_dictconfig() -> None:
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), {"name": "resnet20"})
    plain = OmegaConf.create({"name": "gn", "num_groups": 8})
    model = build_model(cfg, plain, 7)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    with pytest.raises(ValueError, match="num_classes must be an int >= 1"):
        build_model(cfg, plain, 0)


def test_one_registration_is_all_a_new_model_needs() -> None:
    """docs/models.md "Add your own model": a decorated builder makes the name valid everywhere."""
    from hydra import compose, initialize_config_dir

    from src.config import validate_config
    from src.models.norms import norm_layer_factory
    from src.syncbn import SyncBatchNorm2d

    @MODELS.register("my_test_net", family=ModelFamily("my_test_net", output=IMAGE_LOGITS))
    def build_my_test_net(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> torch.nn.Module:
        norm = norm_layer_factory(norm_cfg)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, bias=False), norm(8), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, num_classes))

    try:
        assert "classification" in model_tasks("my_test_net")
        model = build_model({"name": "my_test_net"}, {"name": "syncbn"}, 3)
        assert type(model[1]) is SyncBatchNorm2d and model(torch.randn(2, 3, 8, 8)).shape == (2, 3)
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            validate_config(compose("train", overrides=["model.name=my_test_net"]))
            # A dataset of no task the model serves is refused naming both (none in a classification-only project).
            for data in [e for e in DATASETS if not set(e.tasks) & set(model_tasks("my_test_net"))][:1]:
                with pytest.raises(ValueError, match=f"model.name=my_test_net .serves .*. and data.name={data.name} "
                                                     r".serves .*. have no task in common"):
                    validate_config(compose("train", overrides=["model.name=my_test_net", f"data={data.name}"]))
    finally:
        MODELS._entries.pop("my_test_net")  # the registry is process-wide: leave it as it was
