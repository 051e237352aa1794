"""Hv's inputs beyond the row above, measured on equal terms (fresh weights, Smooth-L1 + KL of the guided
distributions, the same steps and grids): the held-out expected acceptance of Hv on the bundled model.

    python -m ssd_core.dev.hv_left GRIDS HELDOUT_GRIDS N STEPS FORMS
    python -m ssd_core.dev.hv_left build/heads/data_grids.safetensors build/heads/heldout_grids.safetensors 800 400 plain,left,left+right

Every form reads the cell above the drafted cell (vertical_shift 1) and its token; then
  plain:        nothing else (the previous shipped form)
  left:         + the token on the left of the drafted cell (drafted just before it in the row)
  left+rtoken:  + the token above-right of the drafted cell
  left+right:   + the feature and token above-right (the shipped `vertical_left` form)
  left+rec:     + Hv's own feature of the cell on the left (unrolled along the row, as drafting would run it)
(features of the first N shuffled grids are stored beside GRIDS as GRIDS.hvN.safetensors and reused, as
ssd_core.dev.hv_input does)."""
import os, sys, time

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

import ssd_core
from ssd_core.acceptance import guided_logp, overlap
from ssd_core.heads import DraftHead
from ssd_core.sampling import guide, settings_from
from ssd_core.train import collect_features, read_grids

torch.manual_seed(0)
m = ssd_core.load_model('reference')
s = settings_from(m.defaults); lay = m.layout(None)
H, W = lay.grid; cells = lay.slot_of_cell.view(H, W)
GRIDS, HELD, N, steps, forms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(',')
INPUTS = {"plain": 2, "left": 3, "left+rtoken": 4, "left+right": 5, "left+rec": 4}
feat_path = f"{GRIDS}.hv{N}.safetensors"
if os.path.exists(feat_path):
    t = load_file(feat_path); h, ids, hh, idsh = t["h"], t["ids"], t["hh"], t["idsh"]
else:
    pr, co = read_grids(GRIDS, m)
    o = torch.randperm(len(pr), generator=torch.Generator().manual_seed(0))[:N]
    h, ids = collect_features(m, [pr[i] for i in o.tolist()], co[o], s, lay, 32, torch.float16)
    hh, idsh = collect_features(m, *read_grids(HELD, m), s, lay, 32, torch.float16)
    save_file({"h": h.contiguous(), "ids": ids, "hh": hh.contiguous(), "idsh": idsh}, feat_path)
up = cells[:-1][:, (torch.arange(W) + 1).clamp(max=W - 1)]  # [H-1, W] the cell above the drafted cell
right = cells[:-1][:, (torch.arange(W) + 2).clamp(max=W - 1)]  # ... and the one above-right


def predict(head, form, hb, e):
    """[b, S, H-1, W, d] the feature at (y, x) for y >= 1 (it drafts (y, x+1)), teacher-forced."""
    S = hb.shape[1]
    tok = lambda c: e[:, None, c].expand(-1, S, -1, -1, -1)  # noqa: E731
    more = {"plain": [], "left": [tok(cells[1:])], "left+rtoken": [tok(cells[1:]), tok(right)],
            "left+right": [tok(cells[1:]), hb[:, :, right + 1], tok(right)]}
    if form in more:
        return head(hb[:, :, up + 1], tok(up), *more[form])
    prev, out = hb[:, :, cells[1:, 0]], []  # left+rec: from the true feature of the slot before the row
    for x in range(W):
        prev = head(hb[:, :, up[:, x] + 1], tok(up)[:, :, :, x], tok(cells[1:])[:, :, :, x], prev)
        out.append(prev)
    return torch.stack(out, dim=3)


@torch.no_grad()
def score(head, form):
    tot, n = 0.0, 0
    for b in range(0, hh.shape[0], 16):
        hb = hh[b:b + 16].float(); e = m.embed(idsh[b:b + 16])
        p = guided_logp(m, hb[:, :, cells[1:, 1:]], s)
        tot += overlap(p, guided_logp(m, predict(head, form, hb, e)[:, :, :, :-1], s)).sum().item()
        n += p.shape[0] * (H - 1) * (W - 1)
    return tot / n


for p in m.model.parameters():
    p.requires_grad_(False)
res = {}
for form in forms:
    torch.manual_seed(0)
    head = DraftHead(m.hidden_size, m.hidden_size, inputs=INPUTS[form])
    opt = torch.optim.AdamW(head.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 2e-3, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(1); t0 = time.time()
    for st in range(steps):
        idx = torch.randint(0, h.shape[0], (8,), generator=g)
        hb = h[idx].float(); e = m.embed(ids[idx])
        pred = predict(head, form, hb, e)
        loss = F.smooth_l1_loss(pred, hb[:, :, cells[1:] + 1])
        with torch.no_grad():
            logp = guided_logp(m, hb[:, :, cells[1:, 1:]], s)
        logq = guide(m.image_logits(pred[:, :, :, :-1]).transpose(0, 1), s.cfg).log_softmax(-1)
        loss = loss + (logp.exp() * (logp.clamp(min=-1e30) - logq)).sum(-1).mean()
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        if (st + 1) % max(1, steps // 4) == 0:
            print(f"{form} step {st + 1} ({time.time() - t0:.0f} s): held-out Hv expected {score(head, form):.4f}", flush=True)
    res[form] = round(score(head, form), 4)
print("RESULT", N, steps, res, flush=True)
