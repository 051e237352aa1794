"""The per-layout index of a generation (SlotIndex): which slots are forced, where the image slots are, and the same
as device tensors. It depends only on the layout and the model (its device and code -> id map), so every Run of
a layout shares one (`SlotIndex.of`); nothing in it changes while a run decodes."""
from __future__ import annotations

import torch

from .session import Layout


class SlotIndex:
    """Host lists and device tensors looked up by slot (0..L-1) or by image rank (0..I-1: the i-th image slot)."""

    def __init__(self, layout: Layout, model):
        dev = model.device
        L = layout.num_slots
        self.L, self.V = L, model.image_vocab_size  # slots; image codes
        self.forced = (layout.forced >= 0).tolist()  # [L] host bools: a forced (not image) slot
        self.image_slots = [s for s in range(L) if not self.forced[s]]  # host: image slots in order (rank -> slot)
        self.images_before = [0] * (L + 1)  # host: image slots before each slot (slot -> rank)
        self.next_image = [L] * (L + 1)  # host: the first image slot at or after each slot
        for s in range(L):
            self.images_before[s + 1] = self.images_before[s] + (not self.forced[s])
        for s in range(L - 1, -1, -1):
            self.next_image[s] = s if not self.forced[s] else self.next_image[s + 1]
        self.slot_ids = torch.arange(L + 1, device=dev)  # [L+1] slot numbers (sliced, never copied from the host)
        self.forced_ids = layout.forced.to(dev)  # [L] the forced token id at a slot, -1 at an image slot
        self.forced_mask = self.forced_ids >= 0  # [L] bool
        self.image_ids = self.slot_ids[:L][~self.forced_mask]  # [I] image slots
        self.id_of_code = model.code_to_id(torch.arange(self.V, device=dev))  # [V] sequence id of each image code

    @staticmethod
    def of(layout: Layout, model) -> SlotIndex:
        """The index of this layout for this model (on its device), made once and kept on the layout: the runs of
        a batch, which share their layout, share it. (Layout is frozen: kept in its __dict__, as its cached
        row_stride is.)"""
        made = vars(layout).setdefault("_slot_index", {})
        key = (model, str(model.device))
        if key not in made:
            made[key] = SlotIndex(layout, model)
        return made[key]

    def is_image(self, slot: int) -> bool:
        return 0 <= slot < self.L and not self.forced[slot]

    def slots(self, lo: int, hi: int) -> torch.Tensor:
        """[hi - lo] the slot numbers lo..hi-1 on the device."""
        return self.slot_ids[lo:hi]
