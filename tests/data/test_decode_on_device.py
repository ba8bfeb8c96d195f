"""data.decode_on_device: JPEG bytes decoded (torchvision.io.decode_jpeg, device="cpu") and augmented in the
training process give bitwise the batches of the workers' decoding (PIL), same seeds, with the ImageNet v2
recipe's augmentation; non-JPEG files and decode failures fall back to the CPU; bad settings are refused.
The producer thread (prefetch(threaded=True), as the trainer runs it) gives the same batches, draws nothing
from the training thread's global RNG, raises its errors in the training thread and stops with its loop.
On CUDA (tests marked `cuda`), nvjpeg's pixels are not bitwise the CPU decoder's, so each question is asked
where it has an exact answer: stream safety GPU against GPU (the producer thread's batches, read late by a
slow training stream, bitwise those of the same decode run alone and synchronised), and the decoder against
the CPU's within torchvision's own bar for nvjpeg."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import src.data.device_decode as device_decode
from src.data import DataConfig, set_loader_epoch
from tests.support.task_data import build_datasets, build_train_loader
from src.data.datasets.imagefolder import write_classify
from src.data.device_decode import EncodedImages, decode_batch
from src.data.device_transforms import prefetch
from src.config import data_config

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 RGB JPEGs of 64 px, plus a grayscale JPEG of another size and a PNG (decoded in the worker)."""
    root = write_classify(tmp_path_factory.mktemp("jpegs"), train_per_class=2, val_per_class=1)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (50, 70), dtype=np.uint8)).save(root / "train" / "circle" / "gray.jpg")
    Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(root / "train" / "square" / "rgb.png")
    return root


def _cfg(root: Path, decode: bool, workers: int = 0) -> DataConfig:
    return data_config(name="imagefolder", root=str(root), image_size=32, resize_size=40, batch_size=7,
                      num_workers=workers, auto_augment="trivialaugment", random_erase=0.5, color_jitter=0.2,
                      device_transforms=True, decode_on_device=decode)


def _batches(cfg: DataConfig, seed: int = 5) -> list[tuple[torch.Tensor, Any]]:
    """Every training batch of epoch 1, as the trainer moves them to the device (here the CPU)."""
    bundle = build_datasets(cfg, seed=seed, device_transforms=True)
    loader = build_train_loader(bundle.train, cfg, rank=0, world_size=1, seed=seed)
    set_loader_epoch(loader, 1)
    raw = list(loader)
    assert all(isinstance(images, EncodedImages) for images, _, _ in raw) == cfg.decode_on_device
    return list(prefetch(raw, lambda batch: batch.to(CPU, torch.float32, transform=bundle.device_transform), CPU))


def _assert_same(today: list[tuple[torch.Tensor, Any]], decoded: list[tuple[torch.Tensor, Any]]) -> None:
    assert len(today) == len(decoded) == 2
    for (a, t, _), (b, u, _) in zip(today, decoded):
        assert a.shape == b.shape == (7, 3, 32, 32) and torch.equal(a, b)
        assert torch.equal(t, u)


def test_decoding_on_the_device_gives_the_workers_batches_bitwise(folder: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    today = _batches(_cfg(folder, decode=False))
    _assert_same(today, _batches(_cfg(folder, decode=True, workers=1)))
    # The batches differ from those of another seed: the comparison covers the per-sample randomness.
    assert not torch.equal(today[0][0], _batches(_cfg(folder, decode=False), seed=6)[0][0])
    # A device decoder that refuses every JPEG: each one falls back to the CPU (PIL), same batches.
    calls = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        calls.append(kwargs["device"])
        raise RuntimeError("not decodable here")

    monkeypatch.setattr(device_decode, "decode_jpeg", refuse)
    _assert_same(today, _batches(_cfg(folder, decode=True)))
    assert len(calls) == 2 + 13, "one batched call per batch, then one call per JPEG"


def test_unreadable_jpeg_names_its_file() -> None:
    bad = torch.frombuffer(bytearray(device_decode.JPEG_MAGIC + b"\xe0 not really a JPEG"), dtype=torch.uint8)
    batch = EncodedImages([bad], [True], [[]], ["class/broken.jpg"])
    with pytest.raises(OSError, match="cannot read image class/broken.jpg"):
        decode_batch(batch, CPU)


def test_bad_settings_are_refused(folder: Path) -> None:
    with pytest.raises(ValueError, match="data.decode_on_device must be true or false"):
        data_config(decode_on_device="yes").validate()
    with pytest.raises(ValueError, match="decode_on_device=true needs data.device_transforms=true"):
        data_config(name="imagefolder", decode_on_device=True, device_transforms=False).validate()
    with pytest.raises(ValueError, match="folders of JPEG files \\(imagefolder\\), not to data.name=shapes"):
        data_config(name="shapes", decode_on_device=True, device_transforms=True).validate()
    cfg = data_config(name="imagefolder", root=str(folder), decode_on_device=True)  # auto: off on the CPU
    with pytest.raises(ValueError, match="data.device_transforms=auto is on only when training on CUDA"):
        build_datasets(cfg, seed=0, device_transforms=False)


def _threaded(raw: list[Any], bundle: Any, draws: list[float] | None = None) -> list[Any]:
    """The batches through prefetch(threaded=True) (the producer thread), drawing from the global RNG between
    batches as a training step's MixUp would (into `draws`)."""
    out = []
    for batch in prefetch(raw, lambda b: b.to(CPU, torch.float32, transform=bundle.device_transform), CPU,
                          threaded=True):
        out.append(batch)
        if draws is not None:
            draws.append(float(torch.rand(())))
    return out


def test_the_producer_thread_gives_the_same_batches_and_leaves_the_global_rng_alone(folder: Path) -> None:
    """Decoding and augmenting on the producer thread: the same batches, and the training thread's own draws
    from the global RNG between batches are those it makes without any loading going on."""
    cfg = _cfg(folder, decode=True)
    bundle = build_datasets(cfg, seed=5, device_transforms=True)
    loader = build_train_loader(bundle.train, cfg, rank=0, world_size=1, seed=5)
    set_loader_epoch(loader, 1)
    raw = list(loader)
    torch.manual_seed(123)
    draws: list[float] = []
    batches = _threaded(raw, bundle, draws)
    torch.manual_seed(123)
    assert draws == [float(torch.rand(())) for _ in raw]
    _assert_same(_batches(_cfg(folder, decode=False)), batches)


def test_the_producer_thread_raises_here_and_stops_with_the_loop(folder: Path) -> None:
    """A file no decoder reads fails on the producer: the error reaches the training thread. Leaving the loop
    after the first batch stops the producer: the loader is read one batch ahead, no further."""
    cfg = _cfg(folder, decode=True)
    bundle = build_datasets(cfg, seed=5, device_transforms=True)
    loader = build_train_loader(bundle.train, cfg, rank=0, world_size=1, seed=5)
    raw = list(loader)
    bad = torch.frombuffer(bytearray(device_decode.JPEG_MAGIC + b"\xe0 not really a JPEG"), dtype=torch.uint8)
    images = raw[1].images
    raw[1] = raw[1]._replace(images=images._replace(data=[bad] + images.data[1:],
                                                    paths=["class/broken.jpg"] + images.paths[1:]))
    with pytest.raises(OSError, match="cannot read image class/broken.jpg"):
        _threaded(raw, bundle)
    taken = []

    def counted() -> Any:
        for batch in raw * 3:
            taken.append(batch)
            yield batch

    gen = prefetch(counted(), lambda batch: batch, CPU, threaded=True)
    next(gen)
    gen.close()
    assert len(taken) == 2 and not [t for t in threading.enumerate() if t.name.startswith("prefetch")]


# On a GPU, a slow reader: the training stream spins this many clock cycles (~50 ms at 2 GHz, far longer than
# the producer takes to issue a batch) before it reads the batch it was handed.
SPIN_CYCLES = 100_000_000


@pytest.mark.cuda
def test_the_producer_thread_on_the_gpu_gives_the_synchronised_batches_bitwise(folder: Path) -> None:
    """Stream safety, GPU against GPU: each batch that the producer thread decodes and augments one batch ahead,
    read by the training stream only after it spun ~50 ms (while the producer decodes the next ones into memory
    the caching allocator hands out), is bitwise the batch the same decode gives run alone and synchronised.
    A batch whose memory a later decode reused, or that was read before its decode finished, would differ."""
    gpu = torch.device("cuda", 0)
    cfg = _cfg(folder, decode=True)
    bundle = build_datasets(cfg, seed=5, device_transforms=True)
    loader = build_train_loader(bundle.train, cfg, rank=0, world_size=1, seed=5)
    set_loader_epoch(loader, 1)
    raw = list(loader) * 6

    def move(batch: Any) -> Any:
        return batch.to(gpu, torch.float32, transform=bundle.device_transform)

    # The same kernels on every run (a convolution of TrivialAugment's sharpness: no algorithm search).
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        alone = []
        for batch in raw:
            torch.cuda.synchronize()
            out = move(batch)
            torch.cuda.synchronize()
            alone.append((out.images.cpu(), out.targets.cpu()))
        read = []
        for batch in prefetch(raw, move, gpu, threaded=True):
            torch.cuda._sleep(SPIN_CYCLES)
            read.append((batch.images.clone(), batch.targets.clone()))  # issued after the spin, on the same stream
        torch.cuda.synchronize()
    assert len(read) == len(alone) == 12
    for k, ((images, targets), (want_images, want_targets)) in enumerate(zip(read, alone)):
        assert torch.equal(images.cpu(), want_images), f"batch {k}"
        assert torch.equal(targets.cpu(), want_targets), f"batch {k}"
    # 6 passes over the same 2 batches: the comparison is not between identical outputs of one decode
    assert not torch.equal(alone[0][0], alone[1][0])


def _encoded(paths: list[Path]) -> EncodedImages:
    """The files as one batch of EncodedImages, as the workers hand them over (plans unused here)."""
    data = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in paths]
    encoded = [bool(d[:3].numpy().tobytes() == device_decode.JPEG_MAGIC) for d in data]
    images = [d if enc else device_decode._to_tensor(Image.open(p).convert("RGB")) for d, enc, p in zip(data, encoded, paths)]
    return EncodedImages(images, encoded, [[] for _ in paths], [str(p) for p in paths])


@pytest.mark.cuda
def test_the_gpu_decoder_matches_the_cpus_within_torchvisions_bar(folder: Path, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """nvjpeg (one batched call, on the decoder's stream) against the CPU's libjpeg-turbo, image by image: a mean
    difference under 2 levels, the bar torchvision's own test of decode_jpeg on CUDA sets (test_image.py,
    test_decode_jpeg_cuda); a PNG (decoded by the worker, moved) bitwise. The JPEGs are the training folder's
    images saved without chroma subsampling (4:4:4), and a grayscale one: with subsampled chroma the decoders
    upsample differently by design (libjpeg-turbo's triangle filter), which on these images' sharp coloured
    edges alone reaches about 2 levels (a box-upsampling decoder: 1.4 to 2.4) and is no fault of the wiring."""
    gpu = torch.device("cuda", 0)
    paths = []
    for k, path in enumerate(sorted((folder / "train").rglob("*.jpg"))):
        with Image.open(path) as img:
            if img.mode == "RGB":
                paths.append(tmp_path / f"{k}.jpg")
                img.save(paths[-1], quality=90, subsampling=0)
            else:
                paths.append(path)  # the grayscale JPEG: one channel, nothing to upsample
    paths += sorted((folder / "train").rglob("*.png"))
    batch = _encoded(paths)
    assert sum(batch.encoded) == len(paths) - 1 >= 13
    cpu = decode_batch(batch, CPU)
    with caplog.at_level("WARNING", logger=device_decode.__name__):
        on_gpu = decode_batch(batch, gpu, device_decode.DeviceDecoder(lambda x: x).decode_stream(gpu))
        got = [image.cpu() for image in on_gpu]
    assert "could not be decoded" not in caplog.text  # nvjpeg decoded every one: no CPU fallback compared here
    for path, encoded, a, b in zip(paths, batch.encoded, got, cpu):
        assert a.dtype == b.dtype == torch.uint8 and a.shape == b.shape, path
        if encoded:
            assert float((a.float() - b.float()).abs().mean()) < 2, path
        else:
            assert torch.equal(a, b), path
