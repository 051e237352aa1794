"""One generation's state (Run) and the decoder contract (Policy): what every decoder reads and writes.

A policy decides, after each forward of the base model, which window tokens become final, which are
corrected, and how far the window grows; it touches the state only through Run's helpers.
"""
from __future__ import annotations

import torch

from . import trace as T
from .sampling import SamplerSettings, draw, guide, gumbel, gumbel_argmax, log_probs, seeded_generator
from .session import Layout, Session


class Run:
    """Everything one generation knows; policies read and write it through the helpers below."""

    def __init__(self, model, heads, layout: Layout, settings: SamplerSettings, last_features: torch.Tensor):
        """last_features [B, d]: the prompt's last pre-norm features of this image's streams."""
        self.model, self.heads, self.layout, self.settings = model, heads, layout, settings
        self.session: Session | None = None  # the (batch's) KV cache, set by the engine
        L = layout.num_slots
        self.L, self.V = L, model.image_vocab_size
        self.ids = layout.forced.clone()  # [L] sequence ids; -1 = empty
        self.id_of_code = model.code_to_id(torch.arange(self.V))  # [V] on the CPU: writes need no device trip
        self.forced = (layout.forced >= 0).tolist()  # [L] Python bools: read every step, so not a tensor
        self.codes = torch.full((L,), -1, dtype=torch.long)  # [L] image code per slot
        self.final = layout.forced >= 0  # forced slots are final from the start
        self.drafted = torch.full((L,), -1, dtype=torch.long)  # [L] first draft code of a slot
        self.status = torch.where(self.final, T.FORCED, T.PENDING).to(torch.int8)
        self.step_of = torch.zeros(L, dtype=torch.int32)
        self.round_of = torch.zeros(L, dtype=torch.int32)
        self.cached = 0  # slots whose keys are in the cache (shared by a batch)
        self.keep = 0  # slots this image alone would have cached: the final prefix its window starts after
        self.end = 0  # window = [cached, end)
        self.start = 0  # the window's first slot in the step being decided
        self.verified = torch.zeros(L, dtype=torch.int32)  # forwards each slot has been fed in
        self.value_round = torch.zeros(L, dtype=torch.int32)  # round in which each slot took its value
        self.steps = 0
        self.head_calls = 0
        self.rng = seeded_generator(settings.seed)
        B, d = last_features.shape
        self.features = torch.zeros(B, L, d, dtype=model.dtype, device=model.device)  # latest feature per slot
        self.next_logits = model.image_logits(last_features)  # [B, V] raw logits for slot `cached`
        self.prompt_features = last_features  # [B, d] features predicting slot 0
        self.q = SlotTable(self.V, model.device)  # per open slot: the distribution its token was drawn from
        self.noise = SlotTable(self.V, model.device)  # per open slot: its Gumbel noise (a function of seed, slot)
        self.checks: list[torch.Tensor] = []  # [n, 4] per verification: round, column, accepted, expected

    # ---- views -----------------------------------------------------------------------------
    def first_open(self) -> int:
        """The first slot that is not final (L when done)."""
        open_ = (~self.final).nonzero()
        return int(open_[0]) if open_.numel() else self.L

    def is_image(self, slot: int) -> bool:
        return 0 <= slot < self.L and not self.forced[slot]

    def logp(self, logits: torch.Tensor, slots: torch.Tensor, source: str = "model") -> torch.Tensor:
        """[B, n, V] raw per-stream logits -> [n, V] processed log p for those slots (source: model or heads)."""
        return log_probs(guide(logits, self.settings.cfg), self.settings, slots, logits, source)

    # ---- token writes ------------------------------------------------------------------------
    def set_tokens(self, slots: torch.Tensor, codes: torch.Tensor, draft: bool = True) -> None:
        changed = self.codes[slots] != codes  # the round in which a slot took its current value
        self.value_round[slots[changed]] = (self.verified[slots[changed]] - 1).clamp(min=0)
        self.codes[slots] = codes
        self.ids[slots] = self.id_of_code[codes]
        if draft:
            first = self.drafted[slots] < 0
            self.drafted[slots[first]] = codes[first]

    def finalize(self, slots: torch.Tensor) -> None:
        """Mark image slots final with their current token; the status follows from the first draft.

        round = the verification round (0 = the first check) in which the slot took its final value."""
        if slots.numel() == 0:
            return
        drafted, codes = self.drafted[slots], self.codes[slots]
        st = torch.where(drafted < 0, T.AR, torch.where(drafted == codes, T.ACCEPTED, T.CORRECTED))
        self.status[slots] = st.to(torch.int8)
        self.final[slots] = True
        self.step_of[slots] = self.steps
        self.round_of[slots] = self.value_round[slots]

    def set_end(self, end: int) -> None:
        """The window now ends at `end`, and the forced slots right after it join it (they are fed with the
        tokens before them)."""
        self.end = end
        while self.end < self.L and self.forced[self.end]:
            self.end += 1

    def open_in(self, lo: int, hi: int) -> torch.Tensor:
        """Slots in [lo, hi) that are image cells and not final yet."""
        idx = torch.arange(lo, min(hi, self.L))
        return idx[~self.final[idx]]

    def q_at(self, slots: torch.Tensor) -> torch.Tensor:
        """[n, V] the distributions the current tokens of these (open) slots were drawn from."""
        return self.q.get(slots)

    def put_q(self, slots: torch.Tensor, dist: torch.Tensor) -> None:
        self.q.put(slots, dist, self.first_open())

    def sample(self, logp: torch.Tensor) -> torch.Tensor:
        """Independent samples from rows of log p (the seeded generator of this run)."""
        return draw(logp, self.rng)

    def gumbel_sample(self, logp: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Gumbel-max samples keyed by (seed, slot): the same slot always gets the same noise."""
        if self.settings.temperature == 0:
            return logp.argmax(-1).cpu()
        hi = int(slots[-1]) + 1  # each slot's noise is made once, a row ahead at a time
        if hi > self.noise.hi:
            first = self.first_open()
            new = torch.arange(max(self.noise.hi, first), min(self.L, max(hi, first + self.layout.row_stride)))
            self.noise.put(new, gumbel(self.settings.seed, new, self.V, self.model.device), first)
        return gumbel_argmax(logp.float(), self.noise.get(slots)).cpu()

    def uniform(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.rng)


class SlotTable:
    """Rows [V] for a moving span of slots [lo, hi) on the model's device: what open slots need across steps.

    Slots below the first open one are dropped when the span moves, so the table stays window-sized."""

    def __init__(self, V: int, device):
        self.lo = 0
        self.rows = torch.zeros(0, V, device=device)

    @property
    def hi(self) -> int:
        return self.lo + self.rows.shape[0]

    def get(self, slots: torch.Tensor) -> torch.Tensor:
        return self.rows[slots - self.lo]

    def put(self, slots: torch.Tensor, values: torch.Tensor, first_open: int) -> None:
        """values [n, V] for ascending slots; the span becomes [min(first_open, slots[0]), max(hi, slots[-1] + 1))."""
        lo, hi = min(first_open, int(slots[0])), max(self.hi, int(slots[-1]) + 1)
        if lo != self.lo or hi > self.hi:
            rows = torch.zeros(hi - lo, self.rows.shape[1], device=self.rows.device)
            a, b = max(lo, self.lo), min(self.hi, hi)
            if b > a:
                rows[a - lo:b - lo] = self.rows[a - self.lo:b - self.lo]
            self.rows, self.lo = rows, lo
        self.rows[slots - lo] = values.to(self.rows.device, torch.float32)


class Policy:
    """A decoder: `update` finalizes / corrects after a forward and extends the window with drafts."""

    name = "policy"
    needs_heads = False  # refuses to run without heads
    uses_heads = False  # drafts with heads when they are given

    def begin(self, run: Run) -> None:
        pass

    def visible(self, run: Run) -> torch.Tensor | None:
        """Which window slots other slots may attend to (None: all, plain causal)."""
        return None

    def update(self, run: Run, logits: torch.Tensor, features: torch.Tensor | None) -> None:
        """logits [B, n+1, V] raw per stream for slots cached..end; features [B, n, d] of the window."""
        raise NotImplementedError
