"""Hv's input measured on equal terms: Hv reading the row above shifted by 0 (the paper) or 1 column (the cell
directly above the drafted cell). Hv only, Smooth-L1 + KL of the guided distributions, same init, same steps;
prints the held-out expected acceptance of Hv. On the bundled model:

    python -m tools.hv_input GRIDS HELDOUT_GRIDS N STEPS fresh|shipped [INTERMEDIATE [SHIFTS [KL_WEIGHTS]]]
    python -m tools.hv_input build/heads/data_grids.safetensors build/heads/heldout_grids.safetensors 800 400 fresh

(features of the first N shuffled grids are stored beside GRIDS as GRIDS.hvN.safetensors and reused).
KL_WEIGHTS (default 1): comma list of weights of the KL term, e.g. 1,0 (0: Smooth-L1 on features only)."""
import copy, os, sys, time

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

import ssd_core
from ssd_core.heads import DraftHead
from ssd_core.acceptance import guided_logp, overlap
from ssd_core.sampling import guide, settings_from
from ssd_core.training import read_grids, collect_features
def bundled():
    """The bundled model, its default sampler settings, its layout and its cells [H, W] (slot numbers)."""
    m = ssd_core.load_model('reference')
    lay = m.layout(None)
    for p in m.model.parameters():
        p.requires_grad_(False)
    return m, settings_from(m.defaults), lay, lay.slot_of_cell.view(*lay.grid)


def stored_features(m, s, lay, grids, held, n):
    """Teacher-forced features of the first n shuffled training grids and of the held-out grids: h, ids, hh,
    idsh, stored beside `grids` as GRIDS.hvN.safetensors and read from there when present."""
    path = f"{grids}.hv{n}.safetensors"
    if os.path.exists(path):
        t = load_file(path)
        return t["h"], t["ids"], t["hh"], t["idsh"]
    t0 = time.time()
    pr, co = read_grids(grids, m)
    o = torch.randperm(len(pr), generator=torch.Generator().manual_seed(0))[:n]
    h, ids = collect_features(m, [pr[i] for i in o.tolist()], co[o], s, lay, 32, torch.float16)
    hh, idsh = collect_features(m, *read_grids(held, m), s, lay, 32, torch.float16)
    save_file({"h": h.contiguous(), "ids": ids, "hh": hh.contiguous(), "idsh": idsh}, path)
    print("features", time.time() - t0, flush=True)
    return h, ids, hh, idsh


@torch.no_grad()
def score(m, s, cells, predict, hh, idsh):
    """Held-out expected acceptance of Hv; predict(hb, e) -> [b, S, H-1, W, d] the feature at (y, x), y >= 1."""
    H, W = cells.shape
    tot, n = 0.0, 0
    for b in range(0, hh.shape[0], 16):
        hb = hh[b:b + 16].float()
        e = m.embed(idsh[b:b + 16])
        p = guided_logp(m, hb[:, :, cells[1:, 1:]], s)
        q = guided_logp(m, predict(hb, e)[:, :, :, :-1], s)
        tot += overlap(p, q).sum().item()
        n += p.shape[0] * (H - 1) * (W - 1)
    return tot / n


def fit(m, s, cells, head, predict, h, ids, hh, idsh, steps, lr, kl, label, tv=0.0):
    """Train `head` (Smooth-L1 on features + kl x KL + tv x (1 - sum min(p, q)) of the guided distributions, batch
    8, one-cycle lr), printing the held-out expected acceptance four times; returns the final one."""
    opt = torch.optim.AdamW(head.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(1)
    t0 = time.time()
    for st in range(steps):
        idx = torch.randint(0, h.shape[0], (8,), generator=g)
        hb = h[idx].float()
        e = m.embed(ids[idx])
        pred = predict(hb, e)
        loss = F.smooth_l1_loss(pred, hb[:, :, cells[1:] + 1])
        with torch.no_grad(): logp = guided_logp(m, hb[:, :, cells[1:, 1:]], s)
        logq = guide(m.image_logits(pred[:, :, :, :-1]).transpose(0, 1), s.cfg).log_softmax(-1)
        if kl:
            loss = loss + kl * (logp.exp() * (logp.clamp(min=-1e30) - logq)).sum(-1).mean()
        if tv:
            loss = loss + tv * (1 - torch.minimum(logp.exp(), logq.exp()).sum(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if (st + 1) % max(1, steps // 4) == 0:
            print(f"{label} step {st+1} ({time.time()-t0:.0f} s): held-out Hv expected "
                  f"{score(m, s, cells, predict, hh, idsh):.4f}", flush=True)
    return score(m, s, cells, predict, hh, idsh)


def main():
    torch.manual_seed(0)
    m, s, lay, cells = bundled()
    H, W = lay.grid
    print("stride", lay.row_stride, "L", lay.num_slots, flush=True)
    GRIDS, HELD = sys.argv[1], sys.argv[2]
    N = int(sys.argv[3])
    steps = int(sys.argv[4])
    init = sys.argv[5]  # 'shipped' or 'fresh'
    inter = int(sys.argv[6]) if len(sys.argv) > 6 else 256
    shifts = [int(v) for v in sys.argv[7].split(',')] if len(sys.argv) > 7 else [0, 1]
    kls = [float(v) for v in sys.argv[8].split(',')] if len(sys.argv) > 8 else [1.0]
    h, ids, hh, idsh = stored_features(m, s, lay, GRIDS, HELD, N)

    def hv(head, shift):
        src = cells[:-1][:, (torch.arange(W) + shift).clamp(max=W - 1)]  # [H-1, W]: the cell Hv reads for (y, x)
        return lambda hb, e: head(hb[:, :, src + 1], e[:, None, src].expand(-1, hb.shape[1], -1, -1, -1))

    shipped = ssd_core.load_heads("reference", m)
    if init == "shipped" and (shipped.vertical_left or inter != shipped.intermediate):
        sys.exit("'shipped' starts from the bundled Hv, which must be a plain Hv of the same size: these heads' Hv "
                 "reads the token on its left (vertical_left); use 'fresh' (or tools.hv_left)")
    res = {}
    for shift, kl in [(sh, k) for sh in shifts for k in kls]:
        torch.manual_seed(0)  # the same fresh weights for every setting
        head = copy.deepcopy(shipped.vertical).float() if init == "shipped" else DraftHead(m.hidden_size, inter)
        for p in head.parameters(): p.requires_grad_(True)
        print(f"shift {shift} start: {score(m, s, cells, hv(head, shift), hh, idsh):.4f}", flush=True)
        res[(shift, kl)] = fit(m, s, cells, head, hv(head, shift), h, ids, hh, idsh, steps,
                               1e-3 if init == "shipped" else 2e-3, kl, f"shift {shift} kl {kl}")
    print("RESULT", init, N, steps, res, flush=True)


if __name__ == "__main__":
    main()
