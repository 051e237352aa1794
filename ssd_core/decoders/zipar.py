"""`zipar` (peer): row-parallel decoding as ThisisBillhe/ZipAR releases it, with no verification.

Row y+1 starts once row y has `window` tokens; then every active row writes one token a forward. Cells
not written yet are holes: fed with a placeholder that no other slot may attend to.
"""
import torch

from ..run import Policy, Run


class ZipARPolicy(Policy):
    name = "zipar"

    def __init__(self, window: int | None = None):
        self.window = window
        self.params = {"window": window}

    def begin(self, run: Run) -> None:
        self.w = self.window or max(1, -(-run.layout.grid[1] // 3))
        self.params = {"window": self.w}
        self.started = [False] * run.layout.grid[0]
        self.started[0] = True

    def visible(self, run: Run):
        return run.final[run.cached:run.end].clone()

    def update(self, run: Run, logits, features) -> None:
        H, W = run.layout.grid
        cells = run.layout.slot_of_cell.view(H, W)
        done = run.final[cells].sum(1)  # [H] cells written per row (rows fill left to right)
        new = []
        for y in range(H):
            if self.started[y] and done[y] < W:
                slot = int(cells[y, done[y]])
                if slot - run.start < logits.shape[1] and slot <= run.end:
                    new.append(slot)
        if new:
            slots = torch.tensor(new)
            run.set_tokens(slots, run.sample(run.logp(logits[:, slots - run.start], slots)), draft=False)
            run.finalize(slots)
            done = run.final[cells].sum(1)
            run.set_end(max(run.end, max(new) + 1))
        for y in range(1, H):  # start a row once the row above has `window` tokens
            if not self.started[y] and self.started[y - 1] and done[y - 1] >= min(self.w, W):
                self.started[y] = True
                run.set_end(max(run.end, int(cells[y, 0])))  # the rest of row y-1 joins the window as holes
        holes = run.open_in(run.cached, run.end)
        run.ids[holes] = run.model.code_to_id(torch.zeros_like(holes).to(run.model.device)).cpu()
