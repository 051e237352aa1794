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
A form may end in modifiers: `:tv` trains on Smooth-L1 + 2 (1 - sum min(p, q)) (the expected rejection)
instead of Smooth-L1 + KL, `:kltv` on all three, `:wide` gives Hv a 4x wider MLP, e.g.
    python -m ssd_core.dev.hv_left build/heads/data_grids.safetensors build/heads/heldout_grids.safetensors 800 400 left+right:tv,left+right:wide,left+right:tv:wide
(features of the first N shuffled grids are stored beside GRIDS as GRIDS.hvN.safetensors and reused, as
ssd_core.dev.hv_input does)."""
import sys

import torch

from ssd_core.dev.hv_input import bundled, fit, stored_features
from ssd_core.heads import DraftHead

INPUTS = {"plain": 2, "left": 3, "left+rtoken": 4, "left+right": 5, "left+rec": 4}


def main():
    torch.manual_seed(0)
    m, s, lay, cells = bundled()
    W = lay.grid[1]
    grids, held, n, steps, forms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(',')
    h, ids, hh, idsh = stored_features(m, s, lay, grids, held, n)
    up = cells[:-1][:, (torch.arange(W) + 1).clamp(max=W - 1)]  # [H-1, W] the cell above the drafted cell
    right = cells[:-1][:, (torch.arange(W) + 2).clamp(max=W - 1)]  # ... and the one above-right

    def predictor(head, form):
        def predict(hb, e):
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
        return predict

    res = {}
    for name in forms:
        form, *mods = name.split(":")
        torch.manual_seed(0)
        head = DraftHead(m.hidden_size, m.hidden_size * (4 if "wide" in mods else 1), inputs=INPUTS[form])
        kl, tv = (0.0, 2.0) if "tv" in mods else (1.0, 2.0) if "kltv" in mods else (1.0, 0.0)
        res[name] = round(fit(m, s, cells, head, predictor(head, form), h, ids, hh, idsh, steps, 2e-3, kl, name, tv), 4)
    print("RESULT", n, steps, res, flush=True)


if __name__ == "__main__":
    main()
