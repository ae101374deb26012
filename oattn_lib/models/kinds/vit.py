"""Kind `vit`: torchvision's VisionTransformer (`models.vision_transformer`), trained here on an image dataset.

Its samples are test images; its tokens are the class token (-1) and the image patches;
the ablation measures test accuracy on images that were not extracted.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from ..files import vit_b_16_weights_file
from .base import Ablation, Extraction, HeldOut, ModelKind, Sample, forward_layers

log = logging.getLogger("oattn")

__all__ = ["ViT", "held_out_images"]


class ViT(ModelKind):
    name = "vit"
    trains = True
    prunes = True
    image_patches = True

    def n_tokens(self, model: dict) -> int:
        arch = model["arch"]
        if arch["variant"] == "vit_b_16":
            return 197
        size, patch = model["data"]["image_size"], arch["patch_size"]
        return (size // patch) ** 2 + 1

    def n_units(self, model: dict) -> tuple[int, int]:
        arch = model["arch"]
        if arch["variant"] == "vit_b_16":
            return 12, 12
        return arch["num_layers"], arch["num_heads"]

    def config_problem(self, model: dict, index: int) -> str | None:
        problem = super().config_problem(model, index)
        arch = model["arch"]
        if problem or arch["variant"] != "custom":
            return problem
        where = f"models[{index}] ({model['name']})"
        size, patch = model["data"]["image_size"], arch["patch_size"]
        if size % patch:
            return f"{where}.arch.patch_size: {patch} must divide data.image_size {size}"
        if arch["hidden_dim"] % arch["num_heads"]:
            return f"{where}.arch.num_heads: must divide arch.hidden_dim {arch['hidden_dim']}"
        return None

    def datasets(self, model: dict) -> list[str]:
        return ["cifar10"] if model.get("data", {}).get("dataset") == "cifar10" else []

    def pretrained_weights(self, model: dict) -> str | None:
        if not model.get("pretrained"):
            return None
        return str(vit_b_16_weights_file())  # found without torch: planning a run imports neither

    def prune_params(self, model: dict, prepared: str | None) -> dict:
        return {**super().prune_params(model, prepared), "data": {"image_size": model["data"]["image_size"]}}

    def retrain_problem(self, arch: dict) -> str | None:
        if arch["variant"] != "custom":
            return f"arch.variant: {arch['variant']!r}; the experiment trains the custom ViT only"
        return None

    def validation_metric(self) -> tuple[str, str]:
        return "test_accuracy", "test accuracy"

    def prepare_data(self, data: dict, data_root) -> tuple[dict, dict]:
        from ...data import images  # torch: only for image datasets

        name = data["dataset"]
        size = data["image_size"]
        if name == "digits":
            d = images.digits_dataset(size=size, seed=data["seed"])
            arrays = {k: d[k] for k in ("train_images", "train_labels", "test_images", "test_labels")}
            meta = {"kind": self.name, "dataset": name, "mean": d["mean"], "std": d["std"]}
        else:
            root = Path(data_root)
            tr, trl = images.load_cifar10(root, "train")
            te, tel = images.load_cifar10(root, "test")
            arrays = {"train_images": tr, "train_labels": trl, "test_images": te, "test_labels": tel}
            meta = {"kind": self.name, "dataset": name, "image_size": size, "layout": "NHWC uint8"}
        meta["sizes"] = {k: int(v.shape[0]) for k, v in arrays.items() if k.endswith("labels")}
        log.info("image dataset %s: %s", name, meta["sizes"])
        return arrays, meta

    def build(self, arch: dict, data: dict, meta: dict, pretrained: bool = False):
        from ..checkpoint import build_model

        return build_model(self.name, arch, image_size=data["image_size"], pretrained=pretrained)

    def train(self, net, arrays: dict, meta: dict, data: dict, train: dict, device) -> tuple[dict, list]:
        import torch

        from ... import train as trainlib
        from ...data.images import vit_split

        size = data["image_size"]
        (tr, transform), (te, _) = (vit_split(arrays, meta, s, size) for s in ("train", "test"))
        res = trainlib.train_vit(net, tr, torch.from_numpy(arrays["train_labels"]),
                                 te, torch.from_numpy(arrays["test_labels"]),
                                 epochs=train["epochs"], batch_size=train["batch_size"], lr=train["lr"],
                                 seed=train["seed"], device=device, log=log, transform=transform)
        log.info("test accuracy %.4f", res["test_accuracy"])
        return {"test_accuracy": res["test_accuracy"]}, res["history"]

    def retrain(self, net, arrays: dict, meta: dict, data: dict, train: dict, *, seed: int, steps: int,
                device) -> tuple[dict, float, int, list]:
        import torch

        from ... import train as trainlib
        from ...data.images import vit_images

        size = data["image_size"]
        length = {"steps": steps} if steps else {"epochs": train["epochs"]}
        res = trainlib.train_vit(net, vit_images(arrays, meta, "train", size),
                                 torch.from_numpy(arrays["train_labels"]),
                                 vit_images(arrays, meta, "test", size), torch.from_numpy(arrays["test_labels"]),
                                 batch_size=train["batch_size"], lr=train["lr"], seed=seed, device=device,
                                 log=log, progress=False, **length)
        n_steps = steps or train["epochs"] * math.ceil(arrays["train_labels"].shape[0] / train["batch_size"])
        return {"test_accuracy": res["test_accuracy"]}, res["test_accuracy"], n_steps, res["history"]

    def extraction(self, model: dict, *, data_npz, meta: dict, checkpoint, device, prepared=None) -> Extraction:
        return _ViTExtraction(model, data_npz, meta, checkpoint, device)

    def ablation(self, model: dict, *, data_npz, meta: dict, checkpoint, device) -> Ablation:
        return _ViTAblation(model, data_npz, meta, checkpoint, device)


class _ViTExtraction(Extraction):
    """Test images, one at a time."""

    def __init__(self, model: dict, data_npz, meta: dict, checkpoint, device):
        from ... import store
        from ..checkpoint import load_trained

        self.arrays = store.load_npz(data_npz)
        self.meta = meta
        self.size = model["data"]["image_size"]
        net, _ = load_trained(checkpoint, image_size=self.size)
        self.net = net.to(device).eval()
        self.n_available = self.arrays["test_labels"].shape[0]
        self.available = "test images"
        self.device = device
        self.source_hash = store.file_sha256(checkpoint)

    def sample(self, index: int) -> Sample:
        import torch

        from ...data.images import vit_images
        from ..vision_transformer import vit_attention

        with torch.no_grad():
            img = vit_images({"test_images": self.arrays["test_images"][index:index + 1]}, self.meta, "test",
                             self.size)
            attrs = {"label": int(self.arrays["test_labels"][index])}
            _, s, p = vit_attention(self.net, img.to(self.device))
            scores, probs = s[0], p[0]
            toks = np.arange(-1, probs.shape[-1] - 1)  # -1 = class token, then patch index
        return Sample(toks, None, attrs, probs.shape[-1], probs.shape[0], probs.shape[1],
                      forward_layers(scores, probs))


class _ViTAblation(Ablation):
    def __init__(self, model: dict, data_npz, meta: dict, checkpoint, device):
        from ... import store
        from ..checkpoint import load_trained
        from ..gating import head_layout

        self.arrays, self.meta = store.load_npz(data_npz), meta
        self.size = model["data"]["image_size"]
        net, _ = load_trained(checkpoint, image_size=self.size)
        self.net = net.to(device).eval()
        self.layout = head_layout(self.net, "vit")

    def ranking_samples(self, attention: list):
        import torch

        from ...data.images import vit_images

        idx = np.array([int(a.attrs["source_index"]) for a in attention])
        labels = self.arrays["test_labels"][idx]
        stored = [a.attrs.get("label") for a in attention]
        if any(s is not None and int(s) != int(l) for s, l in zip(stored, labels)):
            raise ValueError("the extracted samples' labels do not match the test images; the dataset "
                             "changed since extraction")
        imgs = vit_images({"test_images": self.arrays["test_images"][idx]}, self.meta, "test", self.size)
        return HeldOut(imgs.float(), torch.from_numpy(labels.astype(np.int64))), idx

    def held_out(self, samples, used, settings: dict, rng, batch_size: int):
        data, picked = held_out_images(self.arrays, self.meta, self.size, used, settings["vit_images"], rng)
        log.info("held out: %d test images, none of the extracted images %s", len(data), used.tolist())
        return data, picked


def held_out_images(arrays: dict, meta: dict, size: int, used: np.ndarray, n: int, rng):
    """(`HeldOut` of up to n test images and their labels, their indices): images not
    among `used`, drawn with `rng`, as model input of `size` pixels."""
    import torch

    from ...data.images import vit_images

    free = np.setdiff1d(np.arange(arrays["test_labels"].shape[0]), used)
    pick = np.sort(rng.choice(free, size=min(n, free.size), replace=False))
    imgs = vit_images({"test_images": arrays["test_images"][pick]}, meta, "test", size)
    return HeldOut(imgs.float(), torch.from_numpy(arrays["test_labels"][pick].astype(np.int64))), pick
