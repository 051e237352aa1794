"""The image-quality yardstick of the bundled model: does the picture show the class that was asked for?

A small CNN classifier trained on the reference data set's training glyphs (the recipe's yardstick
stage), shipped beside the model as `yardstick.safetensors` (fp16 weights; metadata: format, version,
data set version, class names, its own figures). From it, for a set of generated images:
  class accuracy  the share of images the classifier assigns to the class that was asked for
                  (our GenEval / DPG-Bench analogue),
  fd              the Frechet distance between the classifier's penultimate features of the images
                  and of the held-out real glyphs (our FID analogue; the reference statistics ship
                  in the file, so no glyph has to be rendered at run time).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import SSDError, reason, shown

FORMAT = "ssd-yardstick"
FORMAT_VERSION = "1"
IMAGE_SIZE = 96
DEFAULT_PATH = Path(__file__).parent / "reference" / "model" / "yardstick.safetensors"


class Classifier(nn.Module):
    """[N, 3, 96, 96] in [0, 1] -> logits [N, C]; `features` gives the penultimate [N, feature_dim]."""

    def __init__(self, num_classes: int, widths=(24, 48, 96, 128), feature_dim: int = 32):
        super().__init__()
        layers, c = [], 3
        for i, w in enumerate(widths):  # each block halves the resolution: 96 -> 48 -> 24 -> 12 -> 6
            layers += [nn.Conv2d(c, w, 3, stride=2, padding=1), nn.GroupNorm(8, w), nn.SiLU()]
            if i >= 2:  # a second conv only at the low resolutions (cheap on a CPU)
                layers += [nn.Conv2d(w, w, 3, padding=1), nn.GroupNorm(8, w), nn.SiLU()]
            c = w
        self.widths = list(widths)
        self.body = nn.Sequential(*layers)
        self.proj = nn.Linear(2 * c, feature_dim)  # global mean + max pool -> features
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x * 2 - 1)
        return F.silu(self.proj(torch.cat([h.mean(dim=(2, 3)), h.amax(dim=(2, 3))], dim=1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def to_batch(images) -> torch.Tensor:
    """uint8 [N,H,W,3], float [N,H,W,3] in [0,1], or a list of [H,W,3] -> float [N,3,96,96] in [0,1]."""
    if isinstance(images, (list, tuple)):
        images = torch.stack([torch.as_tensor(np.asarray(i) if not isinstance(i, torch.Tensor) else i) for i in images])
    x = torch.as_tensor(images)
    if x.ndim != 4 or x.shape[-1] != 3:
        raise SSDError(f"the yardstick takes RGB images [N, H, W, 3], got shape {tuple(x.shape)}")
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float().clamp(0, 1)
    x = x.permute(0, 3, 1, 2)
    if x.shape[-2:] != (IMAGE_SIZE, IMAGE_SIZE):
        x = F.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False, antialias=True)
    return x.contiguous()


def gaussian(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [D] and covariance [D, D] (float64) of features [N, D]."""
    f = features.double()
    mu = f.mean(0)
    d = f - mu
    return mu, d.t() @ d / max(1, len(f) - 1)


def frechet_distance(mu1, cov1, mu2, cov2) -> float:
    """||mu1 - mu2||^2 + tr(cov1 + cov2 - 2 (cov1 cov2)^1/2), via symmetric eigendecompositions."""
    vals, vecs = torch.linalg.eigh(cov1)
    root1 = vecs @ torch.diag(vals.clamp(min=0).sqrt()) @ vecs.t()
    inner = torch.linalg.eigvalsh(root1 @ cov2 @ root1).clamp(min=0).sqrt().sum()
    return float(((mu1 - mu2) ** 2).sum() + torch.trace(cov1) + torch.trace(cov2) - 2 * inner)


class Yardstick:
    def __init__(self, net: Classifier, meta: dict, ref_features: torch.Tensor, train_features: torch.Tensor):
        self.net = net.eval()
        self.meta = meta
        self.class_names = meta["class_names"]
        self.ref_features = ref_features.double()  # held-out real glyphs (the FD reference)
        self.train_features = train_features.double()  # training glyphs as rendered (real_fd)
        self.ref_mu, self.ref_cov = gaussian(self.ref_features)

    @torch.no_grad()
    def logits_and_features(self, images, batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        x = to_batch(images)
        logits, feats = [], []
        for i in range(0, len(x), batch):
            f = self.net.features(x[i:i + batch].to(self.net.proj.weight.dtype))
            feats.append(f.float())
            logits.append(self.net.head(f).float())
        return torch.cat(logits), torch.cat(feats)

    def classify(self, images) -> torch.Tensor:
        """Predicted class index per image, long [N]."""
        return self.logits_and_features(images)[0].argmax(dim=1)

    def fd_to_real(self, features: torch.Tensor) -> float:
        if len(features) < 2:
            raise SSDError("the Frechet distance needs at least 2 images")
        return frechet_distance(*gaussian(features), self.ref_mu, self.ref_cov)

    def score(self, images, classes) -> dict:
        """class_acc (share classified as asked) and fd (to the held-out real glyphs) of the images."""
        return self._score(*self.logits_and_features(images), classes)

    def report(self, images, classes) -> dict:
        """score's figures, the class called for each image, and per class asked "right/asked" (by name)."""
        logits, feats = self.logits_and_features(images)
        out = self._score(logits, feats, classes)
        asked, called = [int(c) for c in classes], logits.argmax(1).tolist()
        right, total = Counter(a for a, c in zip(asked, called) if a == c), Counter(asked)
        out["called"] = called
        out["per_class"] = {self.class_names[k]: f"{right[k]}/{total[k]}" for k in sorted(total)}
        return out

    def _score(self, logits: torch.Tensor, feats: torch.Tensor, classes) -> dict:
        classes = torch.as_tensor([int(c) for c in classes])
        if len(classes) != len(logits):
            raise SSDError(f"score got {len(logits)} images but {len(classes)} classes")
        return {"class_acc": round(float((logits.argmax(1) == classes).float().mean()), 4),
                "fd": round(self.fd_to_real(feats), 3) if len(feats) >= 2 else None, "n": len(feats)}

    def real_fd(self, n: int | None = None, draws: int = 8, seed: int = 0) -> float:
        """FD of the training glyphs (all, or `n` drawn at random, mean over draws) to the held-out
        glyphs: the floor a perfect generator would reach with that many images."""
        if n is None or n >= len(self.train_features):
            return round(self.fd_to_real(self.train_features), 3)
        g = torch.Generator().manual_seed(seed)
        fds = [self.fd_to_real(self.train_features[torch.randperm(len(self.train_features), generator=g)[:n]])
               for _ in range(draws)]
        return round(float(np.mean(fds)), 3)

    def summary(self, n: int | None = None) -> dict:
        """The yardstick's own figures for a report: version, real_acc, real_fd (and at n images)."""
        out = {"version": self.meta["version"], "data_version": self.meta.get("data_version"),
               "classes": len(self.class_names), "real_acc": float(self.meta["real_acc"]),
               "real_fd": float(self.meta["real_fd"])}
        if n is not None:  # an FD needs 2 images or more
            out[f"real_fd_at_{n}"] = self.real_fd(n) if n >= 2 else None
        return out


def save_yardstick(net: Classifier, path, meta: dict, ref_features: torch.Tensor, train_features: torch.Tensor) -> None:
    from safetensors.torch import save_file

    sd = {f"net.{k}": v.detach().to(torch.float16).contiguous() for k, v in net.state_dict().items()}
    sd["ref_features"] = ref_features.to(torch.float16).contiguous()
    sd["train_features"] = train_features.to(torch.float16).contiguous()
    head = {"format": FORMAT, "format_version": FORMAT_VERSION,
            "config": json.dumps({"num_classes": net.head.out_features, "feature_dim": net.proj.out_features,
                                  "widths": net.widths})}
    save_file(sd, str(path), metadata={**head, **{k: json.dumps(v) for k, v in meta.items()}})


def load_yardstick(path=None) -> Yardstick:
    """The shipped yardstick (default) or another file written by save_yardstick."""
    from safetensors import safe_open

    path = Path(path) if path is not None else DEFAULT_PATH
    if not path.is_file():
        raise SSDError(f"no yardstick at {path}: the bundled one ships as {DEFAULT_PATH}; the recipe's "
                       "yardstick stage writes a new one")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()} if raw.get("format") == FORMAT else {}
    except Exception as err:  # noqa: BLE001 -- safetensors raises several types for a damaged file
        raise SSDError(f"{path} is not a readable safetensors file ({reason(err)}): re-install the pack for the "
                       "bundled yardstick, or make yours again with the recipe's yardstick stage") from None
    if raw.get("format") != FORMAT:
        raise SSDError(f"{path} is not a yardstick file (metadata 'format' is {shown(raw.get('format'))}, "
                       f"expected {FORMAT!r})")
    try:  # what save_yardstick writes: its config, JSON metadata, the network's tensors and both feature sets
        config = json.loads(raw["config"])
        meta = {k: json.loads(v) for k, v in raw.items() if k not in ("format", "format_version", "config")}
        net = Classifier(config["num_classes"], tuple(config["widths"]), config["feature_dim"])
        net.load_state_dict({k[4:]: v.float() for k, v in tensors.items() if k.startswith("net.")})
        return Yardstick(net, meta, tensors["ref_features"].float(), tensors["train_features"].float())
    except (KeyError, TypeError, ValueError, RuntimeError) as err:  # a field or tensor missing or of another shape
        what = f"no {err.args[0]!r}" if isinstance(err, KeyError) and err.args else reason(err, fold=True)
        raise SSDError(f"{path} is a damaged yardstick file ({what}): re-install the pack for the bundled "
                       "yardstick, or make yours again with the recipe's yardstick stage") from None


def for_model(model) -> Yardstick | None:
    """The yardstick shipped in a class-conditional model's folder (ssd_model.json's `yardstick`, by default
    `yardstick.safetensors`, made for the same class names), else None: other models have no yardstick."""
    from .model_files import inside

    folder = getattr(model, "folder", None)
    spec = getattr(model, "spec", {})
    name = spec.get("yardstick", "yardstick.safetensors")
    path = inside(folder, name, "ssd_model.json's yardstick") if folder is not None else None
    if path is None or not path.is_file() or not spec.get("vq_decoder"):
        return None  # no yardstick, or no pixels to judge
    stick = load_yardstick(path)
    return stick if list(stick.class_names) == list(getattr(model, "class_names", None) or []) else None


def bench_rows(stick: Yardstick, model, prompts, images_by_row: dict) -> tuple[dict, dict]:
    """For `bench`: {row label: {class_acc, fd}} over each row's images, and the yardstick's own
    figures (real_acc, real_fd, and real_fd at the bench's image count) for the report's top level."""
    classes = [model.class_id(p) for p in prompts]
    rows = {}
    for label, images in images_by_row.items():
        s = stick.score(images, classes)
        rows[label] = {"class_acc": s["class_acc"], "fd": s["fd"]}
    return rows, stick.summary(len(prompts))
