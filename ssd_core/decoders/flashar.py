"""`flashar`: FlashAR's anti-diagonal decoding (arXiv 2605.09430, lxazjk/Emu3.5-FlashAR) on its own checkpoint.

H + W - 1 steps: each step writes a whole anti-diagonal from the fused horizontal / vertical heads of the one
before. It runs on a FlashAR checkpoint only (families/flashar.py), through its own loop (flashar_decode.py): the
post-trained model keeps a second KV cache for its vertical block and reads a mid-layer feature, which the engine's
one loop over the base model's raster distribution does not. Lossy against the base model: FlashAR's picture is
its post-trained model's, not Emu3.5-Image's (GenEval 80.48 -> 80.29 at 512 px, its README).
"""
from ..run import Policy


class FlashARPolicy(Policy):
    name = "flashar"
    own_loop = True  # api.generate_batch runs flashar_decode.generate, not the engine

    def update(self, run, logits, features) -> None:
        raise RuntimeError("flashar runs in flashar_decode.py, never in the engine's loop")
