"""Hv's inputs beyond the row above, measured on equal terms (fresh weights, Smooth-L1 + KL of the guided
distributions, the same steps and grids): the held-out expected acceptance of Hv on the bundled model.

    python -m tools.hv_left GRIDS HELDOUT_GRIDS N STEPS FORMS
    python -m tools.hv_left build/heads/data_grids.safetensors build/heads/heldout_grids.safetensors 800 400 plain,left,left+right

Every form reads the cell above the drafted cell (vertical_shift 1) and its token; then
  plain:        nothing else (the previous shipped form)
  left:         + the token on the left of the drafted cell (drafted just before it in the row)
  left+rtoken:  + the token above-right of the drafted cell
  left+right:   + the feature and token above-right (the shipped `vertical_left` form)
  left+rec:     + Hv's own feature of the cell on the left (unrolled along the row, as drafting would run it)
  left2:        (in place of left) the tokens one and two to the left of the drafted cell (raster order: the
                row above's last cell for the first column); left3 also the one three to the left
  ul:           + the cell above-left of the drafted cell (feature and token)
Parts join with +, e.g. left2+right+ul.
A form may end in modifiers: `:tv` trains on Smooth-L1 + 2 (1 - sum min(p, q)) (the expected rejection)
instead of Smooth-L1 + KL, `:kltv` on all three, `:wide` gives Hv a 4x wider MLP (`:wide8` 8x), e.g.
    python -m tools.hv_left build/heads/data_grids.safetensors build/heads/heldout_grids.safetensors 800 400 left+right:tv,left+right:wide,left+right:tv:wide
(features of the first N shuffled grids are stored beside GRIDS as GRIDS.hvN.safetensors and reused, as
tools.hv_input does)."""
import sys

import torch

from tools.hv_input import bundled, fit, stored_features
from ssd_core.heads import DraftHead

PARTS = {"plain": 0, "left": 1, "left2": 2, "left3": 3, "rtoken": 1, "right": 2, "ul": 2}  # inputs each adds


def main():
    torch.manual_seed(0)
    m, s, lay, cells = bundled()
    W = lay.grid[1]
    grids, held, n, steps, forms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(',')
    h, ids, hh, idsh = stored_features(m, s, lay, grids, held, n)
    up = cells[:-1][:, (torch.arange(W) + 1).clamp(max=W - 1)]  # [H-1, W] the cell above the drafted cell
    right = cells[:-1][:, (torch.arange(W) + 2).clamp(max=W - 1)]  # ... and the one above-right
    left2 = cells.flatten()[torch.arange(W, cells.numel()) - 1].view(-1, W)  # [H-1, W] the cell before the left one
    left3 = cells.flatten()[torch.arange(W, cells.numel()) - 2].view(-1, W)  # ... and the one before that
    ul = cells[:-1]  # [H-1, W] the cell above-left of the drafted cell

    def predictor(head, form):
        def predict(hb, e):
            """[b, S, H-1, W, d] the feature at (y, x) for y >= 1 (it drafts (y, x+1)), teacher-forced."""
            S = hb.shape[1]
            tok = lambda c: e[:, None, c].expand(-1, S, -1, -1, -1)  # noqa: E731
            parts = form.split("+")
            lefts = 3 if "left3" in parts else 2 if "left2" in parts else 1 if "left" in parts else 0
            more = ([tok(cells[1:])] if lefts else []) + ([tok(right)] if "rtoken" in parts else [])
            more += [hb[:, :, right + 1], tok(right)] if "right" in parts else []
            more += [tok(left2), tok(left3)][:max(lefts - 1, 0)] + ([hb[:, :, ul + 1], tok(ul)] if "ul" in parts else [])
            if "rec" not in parts:  # in the order the pack's vertical_left Hv reads them (heads.py)
                return head(hb[:, :, up + 1], tok(up), *more)
            prev, out = hb[:, :, cells[1:, 0]], []  # left+rec: from the true feature of the slot before the row
            for x in range(W):
                prev = head(hb[:, :, up[:, x] + 1], tok(up)[:, :, :, x], tok(cells[1:])[:, :, :, x], prev)
                out.append(prev)
            return torch.stack(out, dim=3)
        return predict

    res = {}
    for name in forms:
        form, *mods = name.split(":")
        torch.manual_seed(0)
        inputs = 4 if form == "left+rec" else 2 + sum(PARTS[p] for p in form.split("+"))
        head = DraftHead(m.hidden_size, m.hidden_size * (8 if "wide8" in mods else 4 if "wide" in mods else 1), inputs=inputs)
        kl, tv = (0.0, 2.0) if "tv" in mods else (1.0, 2.0) if "kltv" in mods else (1.0, 0.0)
        res[name] = round(fit(m, s, cells, head, predictor(head, form), h, ids, hh, idsh, steps, 2e-3, kl, name, tv), 4)
    print("RESULT", n, steps, res, flush=True)


if __name__ == "__main__":
    main()
