"""DeepLabV3 / V3+: output shapes at OS8 and OS16 with and without the aux head; torchvision compatibility; its
options; the shared model checks (norm positions, seeding, parameter groups, conf files) on DeepLab."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torchvision.models import get_model_weights
from torchvision.models.segmentation import deeplabv3_resnet50
from torchvision.models.segmentation.deeplabv3 import DeepLabHead

from src.models import NormConfig, build_model, model_family, model_schema, param_groups
from src.models.activation_checkpointing import enable_activation_checkpointing
from src.models.deeplab import deeplab_head
from src.tasks import task_models
from tests.models.test_cifar_resnet import assert_same_seed_same_weights
from tests.models.test_config import assert_refused, load
from tests.models.test_cuda import (test_torch_syncbn_accepted_and_matches_bn_on_one_gpu,  # noqa: F401  (DeepLab's)
                                    test_training_step_on_gpu_channels_last)
from tests.models.test_norms import (test_bn_gets_eps_and_momentum_everywhere,  # noqa: F401  (run on DeepLab's)
                                     test_checkpoint_moves_between_bn_syncbn_frozen_bn, test_norm_placed_everywhere)
from tests.models.test_param_groups import names_of
from tests.models.test_syncbn_model import test_syncbn_model_on_two_processes_matches_bn_on_one  # noqa: F401
from tests.syncbn.test_recompute import MICRO_BATCHES, _batches, _compare, _two_runs

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


@pytest.mark.parametrize("variant", ["deeplabv3", "deeplabv3plus"])
@pytest.mark.parametrize("output_stride", [8, 16])
@pytest.mark.parametrize("aux", [0.0, 0.4])
def test_output_shapes(variant: str, output_stride: int, aux: float) -> None:
    cfg = {"name": f"{variant}_resnet18", "output_stride": output_stride, "aux_loss_weight": aux,
           "head_channels": 32}
    model = build_model(cfg, {"name": "bn"}, 4)
    assert (model.aux_classifier is None) == (aux == 0)
    x = torch.randn(2, 3, 35, 49)  # odd sizes: the logits must still come back at the input size
    out = model(x)
    assert set(out) == ({"out", "aux"} if aux else {"out"})
    assert all(v.shape == (2, 4, 35, 49) for v in out.values())
    # The stride really is the configured one: layer4 features at 1/output_stride of the input.
    features = model.backbone(torch.randn(1, 3, 64, 64))
    assert features["out"].shape[-2:] == (64 // output_stride, 64 // output_stride)
    if variant == "deeplabv3plus":
        assert features["low_level"].shape[-2:] == (16, 16)  # layer1: output stride 4
    out["out"].mean().backward()  # every head gets gradients
    assert all(p.grad is not None for p in model.classifier.parameters())


def test_aspp_rates_follow_output_stride() -> None:
    rates = {}
    for os_ in (8, 16):
        model = build_model({"name": "deeplabv3_resnet18", "output_stride": os_, "head_channels": 16}, {}, 2)
        aspp = model.classifier[0]
        rates[os_] = [conv[0].dilation[0] for conv in list(aspp.convs)[1:4]]
    assert rates == {8: [12, 24, 36], 16: [6, 12, 18]}


def test_deeplabv3plus_decoder_layout() -> None:
    model = build_model({"name": "deeplabv3plus_resnet50", "head_channels": 256}, {}, 5)
    head = model.classifier
    assert head.project[0].in_channels == 256 and head.project[0].out_channels == 48  # layer1 of ResNet-50
    assert head.fuse[0].in_channels == 256 + 48 and head.fuse[0].kernel_size == (3, 3)
    assert head.fuse[3].kernel_size == (3, 3) and head.classifier.out_channels == 5


@pytest.mark.parametrize("norm", ["bn", "syncbn"])
def test_stride2_decoder_uses_the_stem_and_keeps_the_stride4_layout(norm: str) -> None:
    """decoder_stride=2: logits at 1/2 of the input from a stage on the stem's features; the rest unchanged."""
    base = {"name": "deeplabv3plus_resnet18", "output_stride": 16, "aux_loss_weight": 0.5, "head_channels": 32}
    torch.manual_seed(0)
    model = build_model({**base, "decoder_stride": 2}, {"name": norm}, 4)
    stride4 = build_model(base, {"name": norm}, 4).state_dict()
    extra = {k: v.shape for k, v in model.state_dict().items() if k not in stride4}
    assert all(k.startswith(("classifier.project_fine.", "classifier.refine.")) for k in extra) and extra
    assert model.classifier.project_fine[0].in_channels == 64  # the stem's conv1 output
    assert model.classifier.refine[0].in_channels == 32 + 16 and model.classifier.classifier.in_channels == 16
    assert type(model.classifier.refine[1]).__name__ == type(model.classifier.fuse[1]).__name__  # norm injected
    seen = {}
    model.classifier.classifier.register_forward_hook(lambda mod, args, out: seen.setdefault("logits", out))
    x = torch.randn(2, 3, 35, 49)
    out = model(x)
    assert seen["logits"].shape[-2:] == (18, 25)  # stem: ceil(35/2), ceil(49/2)
    assert all(v.shape == (2, 4, 35, 49) for v in out.values())
    out["out"].mean().backward()
    assert model.classifier.project_fine[0].weight.grad.abs().sum() > 0


def test_head_layout_is_torchvisions() -> None:
    ours, theirs = deeplab_head(512, 7, (12, 24, 36)).state_dict(), DeepLabHead(512, 7).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


def test_torchvision_deeplabv3_resnet50_state_dict_loads_strictly() -> None:
    """Same module names and shapes as torchvision's (OS8 + aux): its COCO weights file would load."""
    with torch.device("meta"):
        theirs = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=True)
        ours = build_model({"name": "deeplabv3_resnet50", "output_stride": 8, "aux_loss_weight": 0.5}, {}, 21)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}


def test_batch_of_one_trains_with_gn() -> None:
    """Batch-independent norms work with one image per process (BN's 1x1 ASPP pooling branch would not)."""
    model = build_model({"name": "deeplabv3_resnet18", "head_channels": 16}, {"name": "gn", "num_groups": 8}, 3)
    model.train()
    assert model(torch.randn(1, 3, 32, 32))["out"].shape == (1, 3, 32, 32)


@pytest.mark.parametrize("name", ["deeplabv3_resnet18", "resnet50"])
def test_zero_init_residual_reaches_torchvision_blocks(name: str) -> None:
    """torchvision zero-inits BasicBlock.bn2 / Bottleneck.bn3; our dilated block must still qualify."""
    head = {"head_channels": 16} if name.startswith("deeplab") else {}
    model = build_model({"name": name, "zero_init_residual": True, **head}, {"name": "gn"}, 3)
    last = [m.bn2 if hasattr(m, "conv2") and not hasattr(m, "conv3") else m.bn3
            for m in model.modules() if type(m).__name__ in ("DilatedBasicBlock", "Bottleneck")]
    assert last and all(not norm.weight.any() for norm in last)


# --- DeepLab in the shared model checks (tests/models/test_*.py's, with DeepLab's configurations) -------------

# Every kind of DeepLab norm position: ASPP (incl. its pooling branch), the DeepLabV3+ decoder (both strides) and
# the aux FCN head.
NORM_MODELS = [
    {"name": "deeplabv3_resnet18", "aux_loss_weight": 0.5, "head_channels": 32},
    {"name": "deeplabv3plus_resnet18", "aux_loss_weight": 0.5, "head_channels": 32},
    {"name": "deeplabv3plus_resnet18", "aux_loss_weight": 0.5, "head_channels": 32, "decoder_stride": 2},
]


@pytest.fixture(params=NORM_MODELS, ids=lambda m: m["name"] + ("_decoder_stride2" if m.get("decoder_stride") else ""))
def model_cfg(request: pytest.FixtureRequest) -> dict:
    """The configurations tests/models/test_norms.py's tests run here."""
    return request.param


def test_same_seed_same_weights() -> None:
    assert_same_seed_same_weights({"name": "deeplabv3plus_resnet18", "aux_loss_weight": 0.5, "head_channels": 32})


def test_gn_default_groups_fit_every_layer() -> None:
    model = build_model({"name": "deeplabv3plus_resnet18", "aux_loss_weight": 0.5}, {"name": "gn"}, 3)
    assert model(torch.randn(1, 3, 32, 32))["out"].shape == (1, 3, 32, 32)  # default 16 fits all


@pytest.mark.parametrize("path", sorted(CONF.glob("deeplabv3*.yaml")), ids=lambda p: p.stem)
def test_model_yaml_builds(path: Path) -> None:
    cfg = load(model_schema(), path)
    if cfg.name.endswith("resnet18"):
        model = build_model(cfg, NormConfig(), 21).eval()
        with torch.no_grad():
            out = model(torch.randn(2, 3, 48, 56))
        assert out["out"].shape == (2, 21, 48, 56) and ("aux" in out) == (cfg.aux_loss_weight > 0)
        return
    with torch.device("meta"):
        model = build_model(cfg, NormConfig(), 21)
    count = sum(p.numel() for p in model.parameters())
    if cfg.name.startswith("deeplabv3plus") or cfg.name == "deeplabv3_resnet34":
        assert count > 0  # no published reference (torchvision has neither); shapes are tested on ResNet-18 above
        return
    # torchvision's deeplabv3_* weights include the aux head and 21 classes (counts don't depend on OS).
    assert cfg.aux_loss_weight > 0
    expected = get_model_weights(cfg.name).DEFAULT.meta["num_params"]
    assert count == expected, f"{cfg.name}: {count} parameters, torchvision says {expected}"


def test_its_models_are_registered() -> None:
    assert set(task_models("segmentation")) == {f"deeplabv3{p}_resnet{d}" for p in ("", "plus")
                                                 for d in (18, 34, 50, 101)}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"name": "deeplabv3_resnet18", "output_stride": 32}, "model.output_stride must be 8 or 16, got 32"),
    ({"name": "deeplabv3_resnet18", "aux_loss_weight": -1.0}, "model.aux_loss_weight must be a finite number >= 0"),
    ({"name": "deeplabv3_resnet18", "head_channels": 0}, "model.head_channels must be >= 1"),
    ({"name": "deeplabv3plus_resnet18", "decoder_stride": 8}, "model.decoder_stride must be 4 or 2, got 8"),
    ({"name": "deeplabv3_resnet18", "decoder_stride": 2}, "model.decoder_stride=2 is not read by "
                                                          "model=deeplabv3_resnet18: it is an option of deeplabv3plus"),
    ({"name": "resnet20", "aux_loss_weight": 0.4}, "model.aux_loss_weight=0.4 is not read by model=resnet20: it is an "
                                                   "option of deeplabv3, deeplabv3plus"),
    ({"name": "timm", "arch": "resnet18", "output_stride": 8}, "model.output_stride=8 is not read by model=timm"),
])
def test_bad_options(overrides: dict, message: str) -> None:
    assert_refused(overrides, message)


def test_heads_get_the_multiplier() -> None:
    model = build_model({"name": "deeplabv3plus_resnet18", "aux_loss_weight": 0.5, "head_channels": 16}, {}, 3)
    groups = param_groups(model, 10.0, weight_decay=1e-4, base_lr=0.01)
    assert [g["name"] for g in groups] == ["backbone", "head"]
    backbone, head = (names_of(model, g["params"]) for g in groups)
    assert backbone == {n for n, _ in model.named_parameters() if n.startswith("backbone.")}
    assert head == {n for n, _ in model.named_parameters() if not n.startswith("backbone.")}
    assert any(n.startswith("aux_classifier.") for n in head) and any(n.startswith("classifier.") for n in head)
    assert [(g["lr_mult"], g["lr"], g["weight_decay"]) for g in groups] == [(1.0, 0.01, 1e-4), (10.0, 0.1, 1e-4)]


@pytest.fixture
def syncbn_model_cfg() -> dict:
    """DeepLabV3+ in tests/models/test_syncbn_model.py's 2-rank SyncBN test: every norm position (backbone, ASPP
    incl. its 1x1 pooling branch, decoder, aux head)."""
    return {"name": "deeplabv3plus_resnet18", "output_stride": 16, "aux_loss_weight": 0.5, "head_channels": 16}


@pytest.fixture
def cuda_model_cfg() -> dict:
    """DeepLabV3+ in tests/models/test_cuda.py's GPU checks."""
    return {"name": "deeplabv3plus_resnet18", "aux_loss_weight": 0.5, "head_channels": 32}


@pytest.mark.cuda
def test_logits_at_the_input_size_on_gpu_channels_last(cuda_model_cfg: dict) -> None:
    model = build_model(cuda_model_cfg, {"name": "bn"}, 3).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 65, 97, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x)
    assert out["out"].shape == out["aux"].shape == (2, 3, 65, 97)


@pytest.mark.slow
def test_syncbn_one_process_counts_once_and_deeplab_backbone() -> None:
    cfg = {"name": "deeplabv3plus_resnet18", "output_stride": 16, "head_channels": 16}
    torch.manual_seed(0)
    regions = enable_activation_checkpointing(build_model(cfg, {"name": "syncbn"}, 5), model_family(cfg["name"]))
    assert regions == ["backbone.layer1", "backbone.layer2", "backbone.layer3", "backbone.layer4"]
    # One optimizer step of two micro-batches: a ResNet-18 trunk in float64 is slow on 2 cores.
    gen = torch.Generator().manual_seed(3)
    batches = [(x, torch.randint(0, 5, (2, 16, 16), generator=gen)) for x, _ in _batches(3, 2, 16)[:MICRO_BATCHES]]
    plain, ckpt = _two_runs(cfg, "syncbn", batches,
                            loss_of=lambda out, y: F.cross_entropy(out["out"], y))
    _compare(plain, ckpt)
    assert int(ckpt["state"]["backbone.layer3.0.bn1.num_batches_tracked"]) == MICRO_BATCHES
