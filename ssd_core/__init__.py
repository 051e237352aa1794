"""ssd_core: spatially speculative decoding for autoregressive image models (torch + transformers only)."""
from __future__ import annotations

from .api import generate, list_bundled, load_heads, load_model
from .decoders import DECODERS
from .errors import Cancelled, SSDError
from .heads import DraftHeads

__all__ = ["DECODERS", "Cancelled", "DraftHeads", "SSDError", "generate", "list_bundled", "load_heads", "load_model"]
__version__ = "0.1.0"
