"""`zipar` (peer): row-parallel decoding as ThisisBillhe/ZipAR releases it, with no verification.

Row y+1 starts once row y has `window` tokens; then every active row writes one token a forward. Cells
not written yet are holes: fed with a placeholder that no other slot may attend to.
"""
from ..run import Policy, Run


class ZipARPolicy(Policy):
    name = "zipar"

    def __init__(self, window: int | None):  # None: a third of a row (decoders.make_policy passes it)
        self.window = window

    def begin(self, run: Run) -> None:
        H, W = run.layout.grid
        self.w = self.window or max(1, -(-W // 3))
        self.params = {"window": self.w}
        self.cells = run.layout.slot_of_cell.view(H, W).tolist()  # host: the slot of each cell
        self.cells_dev = run.layout.slot_of_cell.view(H, W).to(run.index.slot_ids.device)
        self.done = [0] * H  # host: cells written per row (rows fill left to right)
        self.done_dev = self.cells_dev.new_zeros(H, 1)  # the same on the device, to index the cells
        self.rows = (0, 1)  # the rows writing now: [first unfinished, last started + 1)

    def visible(self, run: Run):
        return run.tokens.final[run.window.cached:run.window.end].clone()

    def update(self, run: Run, logits, features) -> None:
        H, W = run.layout.grid
        win = run.window
        lo, hi = self.rows
        if lo < hi:  # every active row writes its next cell (its context is the rows above as far as written)
            new = [self.cells[y][self.done[y]] for y in range(lo, hi)]
            assert max(new) <= win.end and max(new) - win.cached < logits.shape[1], "zipar: a row ran past its window"
            slots = self.cells_dev[lo:hi].gather(1, self.done_dev[lo:hi]).squeeze(1)
            run.tokens.write(slots, run.draws.sample(run.logp(logits[:, slots - win.cached], slots)), draft=False)
            run.tokens.finalize(slots)
            self.done_dev[lo:hi] += 1
            for y in range(lo, hi):
                self.done[y] += 1
            win.set_end(max(win.end, max(new) + 1))
        while lo < H and self.done[lo] >= W:
            lo += 1
        if hi < H and self.done[hi - 1] >= min(self.w, W):  # start a row once the row above has `window` tokens
            win.set_end(max(win.end, self.cells[hi][0]))  # the rest of row hi-1 joins the window as holes
            hi += 1
        self.rows = (lo, hi)
        win.advance(self.cells[lo][self.done[lo]] if lo < H else run.index.L, sum(self.done))
        run.tokens.fill_holes(win.cached, win.end)  # holes: open cells are fed a placeholder
