"""A small VQ autoencoder for the reference model: 96x96x3 <-> 24x24 codes (downsample x4).

Codebook: EMA updates on l2-normalised vectors (cosine lookup), dead codes restarted from batch
encodings. Files are safetensors only; the architecture is JSON in the metadata.
"""
from __future__ import annotations

import json

import torch
import torch.nn as nn
import torch.nn.functional as F

VQ_FORMAT = "ssd-reference-vq"
VQ_FORMAT_VERSION = "1"

DEFAULT_CONFIG = {
    "in_channels": 3,
    "channels": [64, 128],     # at full / half resolution; the code resolution uses channels[-1]
    "res_blocks": 1,           # per resolution in the encoder; decoder uses res_blocks + 1
    "codebook_size": 512,
    "code_dim": 32,
    "downsample": 4,
}


def _norm(c: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, c // 4) if c >= 8 else 1, c)


class ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.n1, self.c1 = _norm(c), nn.Conv2d(c, c, 3, padding=1)
        self.n2, self.c2 = _norm(c), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        h = self.c2(F.silu(self.n2(h)))
        return x + h


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch = cfg["channels"]
        nb = cfg["res_blocks"]
        layers = [nn.Conv2d(cfg["in_channels"], ch[0], 3, padding=1)]
        c = ch[0]
        for co in ch:  # each level: downsample x2 then res blocks
            layers.append(nn.Conv2d(c, co, 4, stride=2, padding=1))
            c = co
            layers += [ResBlock(c) for _ in range(nb)]
        layers += [_norm(c), nn.SiLU(), nn.Conv2d(c, cfg["code_dim"], 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch = cfg["channels"]
        nb = cfg["res_blocks"] + 1
        c = ch[-1]
        layers = [nn.Conv2d(cfg["code_dim"], c, 3, padding=1)]
        layers += [ResBlock(c) for _ in range(nb)]
        for co in reversed(ch):  # upsample x2 then res blocks
            layers.append(nn.ConvTranspose2d(c, co, 4, stride=2, padding=1))
            c = co
            layers += [ResBlock(c) for _ in range(max(1, nb - 1))]
        layers += [_norm(c), nn.SiLU(), nn.Conv2d(c, cfg["in_channels"], 3, padding=1)]
        self.net = nn.Sequential(*layers)

    def forward(self, z):
        return self.net(z)


class VQModel(nn.Module):
    def __init__(self, config: dict | None = None):
        super().__init__()
        cfg = dict(DEFAULT_CONFIG)
        cfg.update(config or {})
        if 2 ** len(cfg["channels"]) != cfg["downsample"]:
            raise ValueError("downsample must be 2 ** len(channels)")
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        K, D = cfg["codebook_size"], cfg["code_dim"]
        self.register_buffer("codebook", F.normalize(torch.randn(K, D), dim=1))
        # EMA statistics (training only; not saved)
        self.register_buffer("ema_count", torch.zeros(K), persistent=False)  # 0: first batch initialises
        self.register_buffer("ema_sum", self.codebook.clone(), persistent=False)
        self.ema_decay = 0.99
        self.freeze_codebook = False  # True: decoder-only fine-tuning (codes fixed)
        self.dead_threshold = 1.0  # EMA vectors per step below which a code is restarted

    # --- codes -----------------------------------------------------------------------------
    def _latent(self, images):
        return F.normalize(self.encoder(images * 2 - 1).float(), dim=1)

    def _lookup(self, z):  # z: [B,D,H,W] normalised -> codes [B,H,W] (fp32, also under autocast)
        B, D, H, W = z.shape
        with torch.autocast(z.device.type, enabled=False):
            flat = z.permute(0, 2, 3, 1).reshape(-1, D).float()
            codes = (flat @ self.codebook.t().float()).argmax(dim=1)
        return codes.view(B, H, W)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images [B,3,96,96] in [0,1] -> codes [B,24,24] long."""
        return self._lookup(self._latent(images))

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        return self.codebook[codes].permute(0, 3, 1, 2)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B,H,W] (any H, W) -> images [B,3,4H,4W] in [0,1]."""
        codes = codes.long().to(self.codebook.device)
        z = self.embed(codes).to(next(self.decoder.parameters()).dtype)
        return ((self.decoder(z) + 1) / 2).clamp(0, 1)

    # --- training ----------------------------------------------------------------------------
    def forward(self, images):
        """Training forward: returns (reconstruction in [-1,1]-space, commitment loss, codes)."""
        z = self._latent(images)
        codes = self._lookup(z.detach())
        q = self.embed(codes)
        commit = F.mse_loss(z, q.detach())
        if self.training and not self.freeze_codebook:
            self._ema_update(z.detach(), codes)
        zq = z + (q - z).detach()  # straight-through
        return self.decoder(zq), commit, codes

    @torch.no_grad()
    @torch.autocast("cpu", enabled=False)
    def _ema_update(self, z, codes):
        K = self.codebook.shape[0]
        D = z.shape[1]
        flat = z.permute(0, 2, 3, 1).reshape(-1, D).float()
        onehot = F.one_hot(codes.view(-1), K).float()
        count = onehot.sum(0)
        s = onehot.t() @ flat
        d = self.ema_decay
        self.ema_count.mul_(d).add_(count, alpha=1 - d)
        self.ema_sum.mul_(d).add_(s, alpha=1 - d)
        self.codebook.copy_(F.normalize(self.ema_sum, dim=1))
        # dead-code restarts: codes whose EMA usage fell low take random batch vectors
        dead = self.ema_count < self.dead_threshold
        nd = int(dead.sum())
        if nd:
            pick = flat[torch.randint(0, flat.shape[0], (nd,), device=flat.device)]
            pick = F.normalize(pick + 0.01 * torch.randn_like(pick), dim=1)
            self.codebook[dead] = pick
            self.ema_sum[dead] = pick
            self.ema_count[dead] = 1.0


# --- files (safetensors only) ------------------------------------------------------------------
def save_vq(model: VQModel, path: str, dtype: torch.dtype = torch.float16) -> None:
    from safetensors.torch import save_file
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    meta = {"format": VQ_FORMAT, "format_version": VQ_FORMAT_VERSION, "config": json.dumps(model.config)}
    save_file(sd, path, metadata=meta)


def load_vq(path: str, device="cpu", dtype: torch.dtype = torch.float32) -> VQModel:
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != VQ_FORMAT:
            raise ValueError(
                f"{path}: not a reference VQ file (safetensors metadata 'format' is "
                f"{meta.get('format')!r}, expected {VQ_FORMAT!r})")
        if meta.get("format_version") != VQ_FORMAT_VERSION:
            raise ValueError(f"{path}: VQ format_version {meta.get('format_version')!r}, "
                             f"this code reads {VQ_FORMAT_VERSION!r}")
        try:
            cfg = json.loads(meta["config"])
        except (KeyError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: VQ metadata has no valid JSON 'config': {e}") from None
        sd = {k: f.get_tensor(k) for k in f.keys()}
    with torch.device("meta"):  # the shapes its config asks for, checked before any memory is allocated
        want = {k: tuple(v.shape) for k, v in VQModel(cfg).state_dict().items()}
    wrong = sorted(set(want) ^ set(sd)) or [k for k in want if tuple(sd[k].shape) != want[k]]
    if wrong:
        raise ValueError(f"{path}: VQ weights do not match its config (first: {wrong[0]})")
    model = VQModel(cfg)
    model.load_state_dict(sd)
    return model.to(device=device, dtype=dtype).eval()
