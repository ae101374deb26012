"""Image data for the ViT experiments (docs/method.md §9.3).

- CIFAR-10 (the paper's data) read from the released python pickles, `load_cifar10`,
  and resized and normalised for a ViT-B/16 with `cifar10_for_vit`.
- scikit-learn's handwritten digits, `digits_dataset`: real images that ship with
  scikit-learn (no download), upsampled to 32 x 32 RGB like CIFAR-10, for small models
  and tests.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["digits_dataset", "load_cifar10", "cifar10_for_vit", "CIFAR10_CLASSES",
           "IMAGENET_MEAN", "IMAGENET_STD"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}


def _bilinear(x: torch.Tensor, size: int) -> torch.Tensor:
    """(N, C, h, w) float -> (N, C, size, size), bilinear, pixel centres aligned
    (align_corners=False), the convention of torchvision's Resize."""
    if x.shape[-2:] == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                         antialias=size < max(x.shape[-2:]))


def _check_size(size) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size: expected a positive integer (pixels per side), got {size!r}")
    return int(size)


# -------------------------------------------------------------------------- digits

def digits_dataset(size: int = 32, test_fraction: float = 0.2, seed: int = 0) -> dict:
    """scikit-learn's 8 x 8 handwritten digits as normalised RGB images, split.

    The 1797 images (16 gray levels, 0..16) are scaled to [0, 1], upsampled to
    size x size with bilinear interpolation, replicated to 3 channels, then standardised
    with the mean and standard deviation of the training pixels (one scalar each, as
    all channels are equal). The split is stratified by label and deterministic in
    `seed`.

    Returns dict(train_images, test_images: float32 (N, 3, size, size);
    train_labels, test_labels: int64 in 0..9; mean, std: the floats used, so that
    ``images * std + mean`` gives back intensities in [0, 1]).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    size = _check_size(size)
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (float, int, np.floating)) \
            or not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction: expected a number strictly between 0 and 1, "
                         f"got {test_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")

    digits = load_digits()  # bundled with scikit-learn: no download
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0)[:, None]
    x = _bilinear(x, size).expand(-1, 3, -1, -1)
    y = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=float(test_fraction),
                                           stratify=y, random_state=int(seed), shuffle=True)
    train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    train = x[torch.from_numpy(train_idx)]
    mean = float(train.mean())
    std = float(train.std())

    def norm(t: torch.Tensor) -> np.ndarray:
        return ((t - mean) / std).contiguous().numpy().astype(np.float32, copy=False)

    return {"train_images": norm(train), "train_labels": y[train_idx],
            "test_images": norm(x[torch.from_numpy(test_idx)]), "test_labels": y[test_idx],
            "mean": mean, "std": std}


# ------------------------------------------------------------------------ CIFAR-10

class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, bytes and numpy arrays only: loading a CIFAR batch can
    never run code named in the file."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
                ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
                ("numpy", "ndarray"), ("numpy", "dtype"),
                ("_codecs", "encode")}  # how Python 3 writes bytes at protocol 2

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a CIFAR-10 batch holds "
                                     "only arrays, lists and bytes")


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{str(path)!r}: not a CIFAR-10 python batch ({exc}); delete it and "
                         "fetch the data again with oattn_lib.data.fetch_cifar10") from exc
    if not isinstance(batch, dict):
        raise ValueError(f"{str(path)!r}: expected a pickled dict, got {type(batch).__name__}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"{str(path)!r}: missing key b'data' or b'labels' "
                         f"(keys: {sorted(map(repr, batch))})")
    data = np.asarray(data)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{str(path)!r}: b'data' has shape {data.shape}, expected (N, 3072): "
                         "N images of 3 x 32 x 32 uint8 pixels")
    if data.dtype != np.uint8:
        if not np.issubdtype(data.dtype, np.integer) or data.size and (data.min() < 0 or data.max() > 255):
            raise ValueError(f"{str(path)!r}: b'data' has dtype {data.dtype}, expected uint8 pixels")
        data = data.astype(np.uint8)
    labels = np.asarray(labels)
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{str(path)!r}: b'labels' has shape {labels.shape} and dtype "
                         f"{labels.dtype}, expected {data.shape[0]} integers (one per image)")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{str(path)!r}: labels must lie in 0..9, got {labels.min()}..{labels.max()}")
    # each row: the red, green, blue planes, each 32 x 32 row-major
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int64)


def load_cifar10(root: str | os.PathLike, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 images and labels from the python release in ``root/cifar-10-batches-py``.

    split="train" reads data_batch_1..5 (50000 images) in order, "test" reads
    test_batch (10000). Returns images uint8 (N, 32, 32, 3) (row, column, RGB) and
    labels int64 (N,), classes as in `CIFAR10_CLASSES`.
    """
    if split not in _CIFAR_FILES:
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    root = Path(root)
    base = root / _CIFAR_DIR
    images, labels = [], []
    for name in _CIFAR_FILES[split]:
        path = base / name
        if not path.is_file():
            raise FileNotFoundError(
                f"CIFAR-10 batch {str(path)!r} does not exist. Provide it with "
                f"oattn_lib.data.fetch_cifar10({str(root)!r}) (what the workflow's download rule "
                f"runs), or extract cifar-10-python.tar.gz into {str(root)!r}, or set "
                f"`data_root` in the config to the directory that holds {_CIFAR_DIR}/")
        im, lab = _read_batch(path)
        images.append(im)
        labels.append(lab)
    return np.concatenate(images), np.concatenate(labels)


def cifar10_for_vit(images, size: int = 224, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """A batch of uint8 RGB images (N, H, W, 3) as ViT input (N, 3, size, size), float32.

    Pixels scaled to [0, 1], resized bilinearly (align_corners=False, as torchvision's
    Resize) and normalised per channel with `mean`, `std` (default: ImageNet, the
    torchvision ViT-B/16 weights; Hugging Face's google/vit-base-patch16-224 uses 0.5,
    0.5). The output is 4 * 3 * size^2 bytes per image (600 kB at 224): convert a batch
    at a time. Works on numpy arrays or torch tensors; the result is on the input's
    device (CPU for numpy).
    """
    size = _check_size(size)
    if isinstance(images, torch.Tensor):
        x = images
    else:
        x = torch.from_numpy(np.ascontiguousarray(np.asarray(images)))
    if x.ndim != 4 or x.shape[-1] != 3 or x.shape[0] == 0:
        raise ValueError(f"images: expected a non-empty (N, H, W, 3) batch of RGB images, "
                         f"got shape {tuple(x.shape)}")
    if x.dtype != torch.uint8:
        raise ValueError(f"images: expected uint8 pixels (as load_cifar10 returns), got {x.dtype}")
    m = torch.as_tensor(mean, dtype=torch.float32, device=x.device)
    s = torch.as_tensor(std, dtype=torch.float32, device=x.device)
    if m.shape != (3,) or s.shape != (3,) or bool((s <= 0).any()):
        raise ValueError(f"mean, std: expected three numbers each (std positive), got {mean!r}, {std!r}")
    x = x.permute(0, 3, 1, 2).to(torch.float32) / 255.0
    x = _bilinear(x, size)
    return ((x - m[:, None, None]) / s[:, None, None]).contiguous()


def vit_split(arrays: dict, meta: dict, split: str, size: int):
    """Stored images of a split and the per-batch transform to model input (or None).

    CIFAR-10 stays uint8 at 32 px and is resized batch by batch: its 50,000 training images
    at 224 px would take 30 GB as floats.
    """
    x = torch.from_numpy(arrays[f"{split}_images"])
    if meta.get("dataset") == "cifar10":
        return x, lambda batch: cifar10_for_vit(batch.numpy(), size=size)
    return x, None


def vit_images(arrays: dict, meta: dict, split: str, size: int) -> torch.Tensor:
    """Model input for a (small) set of stored images, e.g. the extracted samples."""
    x, transform = vit_split(arrays, meta, split, size)
    return transform(x) if transform else x
