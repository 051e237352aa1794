"""Hv's input measured on equal terms: Hv reading the row above shifted by 0 (the paper) or 1 column (the cell
directly above the drafted cell). Hv only, Smooth-L1 + KL of the guided distributions, same init, same steps;
prints the held-out expected acceptance of Hv. On the bundled model:

    python -m ssd_core.dev.hv_input GRIDS HELDOUT_GRIDS N STEPS fresh|shipped [INTERMEDIATE [SHIFTS [KL_WEIGHTS]]]
    python -m ssd_core.dev.hv_input build/heads/data_grids.safetensors build/heads/heldout_grids.safetensors 800 400 fresh

(features of the first N shuffled grids are stored beside GRIDS as GRIDS.hvN.safetensors and reused).
KL_WEIGHTS (default 1): comma list of weights of the KL term, e.g. 1,0 (0: Smooth-L1 on features only)."""
import copy, os, sys, time

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

import ssd_core
from ssd_core.acceptance import guided_logp, overlap
from ssd_core.sampling import guide, settings_from
from ssd_core.train import read_grids, collect_features
torch.manual_seed(0)
m = ssd_core.load_model('reference'); d = m.defaults
s = settings_from(d); lay = m.layout(None)
H, W = lay.grid; cells = lay.slot_of_cell.view(H, W)
print("stride", lay.row_stride, "L", lay.num_slots, flush=True)
GRIDS, HELD = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]); steps = int(sys.argv[4]); init = sys.argv[5]  # 'shipped' or 'fresh'
inter = int(sys.argv[6]) if len(sys.argv) > 6 else 256
shifts = [int(v) for v in sys.argv[7].split(',')] if len(sys.argv) > 7 else [0, 1]
kls = [float(v) for v in sys.argv[8].split(',')] if len(sys.argv) > 8 else [1.0]
feat_path = f"{GRIDS}.hv{N}.safetensors"
if os.path.exists(feat_path):
    t = load_file(feat_path); h, ids = t["h"], t["ids"]; hh, idsh = t["hh"], t["idsh"]
else:
    t0 = time.time()
    pr, co = read_grids(GRIDS, m)
    g = torch.Generator().manual_seed(0); o = torch.randperm(len(pr), generator=g)[:N]
    h, ids = collect_features(m, [pr[i] for i in o.tolist()], co[o], s, lay, 32, torch.float16)
    ph, ch = read_grids(HELD, m)
    hh, idsh = collect_features(m, ph, ch, s, lay, 32, torch.float16)
    save_file({"h": h.contiguous(), "ids": ids, "hh": hh.contiguous(), "idsh": idsh}, feat_path)
    print("features", time.time() - t0, flush=True)

def src_cells(shift):
    xs = torch.arange(W)
    src = (xs + shift).clamp(max=W - 1)
    return cells[:-1][:, src]  # [H-1, W]: the cell Hv reads for each (y, x)

def hv(head, hb, e, shift):
    src = src_cells(shift)
    S = hb.shape[1]
    return head(hb[:, :, src + 1], e[:, None, src].expand(-1, S, -1, -1, -1))  # predicted h at (y, x), y>=1

@torch.no_grad()
def score(head, shift):
    tot, n = 0.0, 0
    for b in range(0, hh.shape[0], 16):
        hb = hh[b:b+16].float(); e = m.embed(idsh[b:b+16])
        p = guided_logp(m, hb[:, :, cells[1:, 1:]], s)
        q = guided_logp(m, hv(head, hb, e, shift)[:, :, :, :-1], s)
        tot += overlap(p, q).sum().item(); n += p.shape[0] * (H-1) * (W-1)
    return tot / n

shipped = ssd_core.load_heads("reference", m)
for p in m.model.parameters(): p.requires_grad_(False)
res = {}
for shift, kl in [(sh, k) for sh in shifts for k in kls]:
    head = copy.deepcopy(shipped.vertical).float() if inter == 256 else ssd_core.heads.DraftHead(256, inter)
    if init == "fresh":
        torch.manual_seed(0)  # the same fresh weights for every setting
        for mod in head.modules():
            if hasattr(mod, "reset_parameters"): mod.reset_parameters()
    for p in head.parameters(): p.requires_grad_(True)
    print(f"shift {shift} start: {score(head, shift):.4f}", flush=True)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3 if init == "shipped" else 2e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, opt.param_groups[0]["lr"], total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(1); t0 = time.time()
    for st in range(steps):
        idx = torch.randint(0, h.shape[0], (8,), generator=g)
        hb = h[idx].float(); e = m.embed(ids[idx])
        pred = hv(head, hb, e, shift)
        loss = F.smooth_l1_loss(pred, hb[:, :, cells[1:] + 1])
        with torch.no_grad(): logp = guided_logp(m, hb[:, :, cells[1:, 1:]], s)
        logq = guide(m.image_logits(pred[:, :, :, :-1]).transpose(0, 1), s.cfg).log_softmax(-1)
        loss = loss + kl * (logp.exp() * (logp.clamp(min=-1e30) - logq)).sum(-1).mean()
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        if (st + 1) % max(1, steps // 4) == 0:
            print(f"shift {shift} kl {kl} step {st+1} ({time.time()-t0:.0f} s): held-out Hv expected {score(head, shift):.4f}", flush=True)
    res[(shift, kl)] = score(head, shift)
print("RESULT", init, N, steps, res, flush=True)
