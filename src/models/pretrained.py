"""Pretrained weights by name, through each library's own cache: torchvision's weights enums
(`model.weights=DEFAULT|IMAGENET1K_V2`, files under TORCH_HOME/hub/checkpoints) and timm's pretrained
configs (`model.pretrained=true`, files in the Hugging Face hub cache).

A file already in the cache is read without any network access. A missing one is downloaded by the
library, unless the machine is declared offline with HF_HUB_OFFLINE=1 (the Hugging Face switch; torch.hub
has none, so it is honoured for both); offline, or when the download fails, the error names the file and
the exact cache path to copy it to.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import torch

from src.errors import MissingFileError, UserError
from src.models.registry import MODELS, model_family

# A weights enum member (DEFAULT, IMAGENET1K_V2, ...), optionally qualified (ResNet50_Weights.IMAGENET1K_V2):
# what tells a weights name from a file path in model.weights / model.backbone_weights.
_WEIGHTS_NAME = re.compile(r"^(?:[A-Za-z0-9]+_Weights\.)?[A-Z][A-Z0-9_]*$")
_TRUE = ("1", "true", "yes", "on")


def is_weights_name(value: Any) -> bool:
    """True for a torchvision weights name (DEFAULT, IMAGENET1K_V1, ResNet18_Weights.IMAGENET1K_V1); False for
    a file path (anything with a dot-extension, a slash, or lower case letters)."""
    return isinstance(value, str) and bool(_WEIGHTS_NAME.match(value))


def offline() -> bool:
    """Whether downloads are off: HF_HUB_OFFLINE=1, read at call time (huggingface_hub reads it at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


# --- torchvision ------------------------------------------------------------------------------------------

def torchvision_weights(builder: str, name: str, key: str) -> Any:
    """The weights enum member `name` of torchvision's builder (e.g. resnet50): ValueError listing the names."""
    from torchvision import models

    try:
        enum = models.get_model_weights(builder)
    except (ValueError, KeyError):
        raise UserError(f"{key}={name}: torchvision has no weights for {builder}; use a local file or "
                        f"{key}=null") from None
    member = name.split(".", 1)[1] if "." in name else name
    qualifier = name.split(".", 1)[0] if "." in name else enum.__name__
    names = ["DEFAULT"] + [w.name for w in enum]
    if qualifier != enum.__name__ or member not in names:
        raise UserError(f"{key}={name} is not a weights name of torchvision's {builder}; its names are "
                        f"{', '.join(names)} ({enum.__name__})")
    return enum[member]  # enum["DEFAULT"] is the recommended member


def torchvision_cache_file(weights: Any) -> Path:
    """Where torch.hub.load_state_dict_from_url keeps (and looks for) the file of a weights enum member."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(weights.url).path)


def torchvision_state_dict(weights: Any, key: str) -> dict[str, torch.Tensor]:
    """The state_dict of a weights enum member from TORCH_HOME's cache; downloaded there only when missing."""
    path = torchvision_cache_file(weights)
    what = f"{key}={type(weights).__name__}.{weights.name}"
    if not path.is_file():
        return _missing_or_download(what, path, weights.url,
                                    lambda: weights.get_state_dict(progress=False, check_hash=True))
    # load_state_dict_from_url finds the file in its cache and never goes to the network for it.
    return weights.get_state_dict(progress=False)


def weights_num_classes(weights: Any) -> int | None:
    """The class count of a weights enum member's head (its meta's categories), None when it has none."""
    categories = weights.meta.get("categories")
    return len(categories) if categories else None


def weights_source(cfg: Any, key: str) -> str:
    """The torchvision builder whose weights enum names model.<key> for cfg's model, as its family says
    (ModelFamily.weights_builder); ValueError for families without named weights, saying what to use instead."""
    family = model_family(cfg.name)
    if family.weights_builder is None:
        hint = (" (its weights by name come with model.pretrained=true)" if family.pretrained_file is not None
                else "")
        raise UserError(f"model.{key}={getattr(cfg, key)}: model={cfg.name} has no weights by name{hint}; give a "
                         "local file or null")
    return family.weights_builder(cfg, key)


def backbone_weights_builder(cfg: Any, key: str) -> str:
    """ModelFamily.weights_builder of models with a torchvision ResNet inside and heads of their own (DeepLab,
    detection; the entry's `backbone`): its ImageNet weights are for model.backbone_weights only."""
    if key == "backbone_weights":
        return MODELS.get(cfg.name).info["backbone"]
    raise UserError(f"model.weights={cfg.weights}: names select ImageNet weights for the backbone of "
                     f"{cfg.name}: use model.backbone_weights={cfg.weights} (the heads train from scratch), or "
                     "give model.weights a local file of the whole model")


# --- timm -------------------------------------------------------------------------------------------------

def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, as huggingface_hub resolves it, but from the environment of now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def timm_pretrained_file(pretrained_cfg: dict[str, Any]) -> str:
    """The local file of a timm model's pretrained weights: its Hugging Face repo's file in the hub cache
    (timm's lookup order: the config's hf_hub_filename, else model.safetensors, then pytorch_model.bin), or
    for configs with only a URL, torch.hub's cache. Downloaded by the library only when missing."""
    arch = pretrained_cfg.get("architecture", "?")
    tag = pretrained_cfg.get("tag")
    what = f"model=timm model.arch={arch}{'.' + tag if tag else ''} model.pretrained=true"
    repo = pretrained_cfg.get("hf_hub_id")
    if repo:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        repo_id, _, revision = repo.partition("@")
        revision = revision or "main"
        given = pretrained_cfg.get("hf_hub_filename")
        names = [given] if given else ["model.safetensors", "pytorch_model.bin"]
        cache = hf_hub_cache()
        for filename in names:
            found = try_to_load_from_cache(repo_id, filename, cache_dir=cache, revision=revision)
            if isinstance(found, str) and os.path.isfile(found):
                return found
        folder = cache / f"models--{repo_id.replace('/', '--')}"
        place = (f"{folder}/snapshots/<commit>/{names[0]} with the commit's hash in {folder}/refs/{revision} "
                 f"(what `huggingface-cli download {repo_id} {names[0]}` writes on a connected machine; copy "
                 f"its {folder.name} folder)")
        return _missing_or_download(what, place, f"https://huggingface.co/{repo_id}",
                                    lambda: hf_hub_download(repo_id, names[0], revision=revision, cache_dir=cache))
    url = pretrained_cfg.get("url")
    if not url:
        raise UserError(f"{what}: timm has no pretrained weights for this model (no hf_hub_id or url in its "
                        "pretrained_cfg); set model.pretrained=false or pick a tag with weights (timm.list_pretrained())")
    path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)
    if path.is_file():
        return str(path)
    return _missing_or_download(what, path, url,
                                lambda: torch.hub.download_url_to_file(url, str(path), progress=False) or str(path))


def check_cached_when_offline(cfg: Any) -> None:
    """With HF_HUB_OFFLINE set, every weights file named by the config must be in its cache: checked with the
    config, before any process group starts, with the error the model builder would raise later."""
    if not offline():
        return
    for key in ("weights", "backbone_weights"):
        name = getattr(cfg, key)
        if is_weights_name(name):
            weights = torchvision_weights(weights_source(cfg, key), name, f"model.{key}")
            path = torchvision_cache_file(weights)
            if not path.is_file():
                _missing_or_download(f"model.{key}={type(weights).__name__}.{weights.name}", path, weights.url,
                                     lambda: None)
    family = model_family(cfg.name)
    if cfg.pretrained and family.pretrained_file is not None:
        family.pretrained_file(cfg)  # offline: a lookup in the cache, or the error


def _missing_or_download(what: str, place: Path | str, url: str, download: Callable[[], Any]) -> Any:
    """Offline: FileNotFoundError naming the file and where it goes. Online: the library's download, whose
    failure becomes the same error with the cause."""
    how = (f"put the file at {place}: download it on a connected machine from {url} (or run the same command "
           "there, which fills the same cache) and copy it over")
    if offline():
        raise MissingFileError(f"{what}: the weights are not in the local cache and HF_HUB_OFFLINE is set; {how}")
    if isinstance(place, Path):
        place.parent.mkdir(parents=True, exist_ok=True)
    try:
        return download()
    except Exception as err:  # network errors come as URLError, OSError, requests' and huggingface_hub's own
        raise MissingFileError(f"{what}: the weights are not in the local cache and downloading them failed "
                               f"({type(err).__name__}: {err}); {how}") from err
