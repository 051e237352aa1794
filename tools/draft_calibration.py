"""Draft-side calibration, measured (not used by the pack): held-out expected acceptance sum min(p, q) and the
Gumbel-coupled match rate of the heads' drafts when q is made with its own guidance scale and temperature:
python -m tools.draft_calibration GRIDS.safetensors HEADS.safetensors"""
import sys
from dataclasses import replace

import torch

import ssd_core
from ssd_core.acceptance import horizontal_chain, overlap, vertical_drafts
from ssd_core.sampling import guide, log_probs, settings_from
from ssd_core.training import collect_features, read_grids

m = ssd_core.load_model('reference')
d = m.defaults
s = settings_from(d)
lay = m.layout(None)
prompts, codes = read_grids(sys.argv[1], m)
h, ids = collect_features(m, prompts, codes, s, lay, 32)
heads = ssd_core.load_heads(sys.argv[2], m)
H, W = lay.grid
cells = lay.slot_of_cell.view(H, W)
gen = torch.Generator().manual_seed(0)


def match(lq, lp, n=8):  # P[argmax(log q + g) == argmax(log p + g)], by the last axis but one
    r = 0.0
    for _ in range(n):
        g = -torch.log(-torch.log(torch.rand(lp.shape, generator=gen).clamp_min(1e-20)))
        r += ((lq + g).argmax(-1) == (lp + g).argmax(-1)).float().mean(dim=tuple(range(lp.dim() - 2))) / n
    return r


with torch.no_grad():
    e = m.embed(ids)
    p = log_probs(guide(m.image_logits(h[:, :, cells[:, 1:]]).transpose(0, 1), s.cfg), s, check=False)  # [N, H, W-1, V]
    lv = m.image_logits(vertical_drafts(heads, h, e, lay)).transpose(0, 1)  # [S, N, H-1, W-1, V] Hv drafts
    lh = m.image_logits(horizontal_chain(heads, h, e, lay)[:, :, 0]).transpose(0, 1)  # [S, N, W-1, V] row-0 Hh chain
    for cfg in (1.0, 1.5, 2.0, 3.0, s.cfg):
        for t in (0.7, 0.85, 1.0, 1.15):
            sd = replace(s, cfg=cfg, temperature=s.temperature * t)
            qv, qh = (log_probs(guide(x, cfg), sd, check=False) for x in (lv, lh))
            oh, mh = overlap(p[:, 0], qh), match(qh, p[:, 0])
            print(f"draft cfg {cfg} temperature x{t}: Hv expected {overlap(p[:, 1:], qv).mean():.4f} match "
                  f"{match(qv, p[:, 1:]).mean():.4f} | Hh row 0 expected {oh.mean():.4f} (depth 1-5 {oh[:, :5].mean():.4f}) "
                  f"match {mh.mean():.4f} (depth 1-5 {mh[:5].mean():.4f})", flush=True)
