"""ssd_core: spatially speculative decoding for autoregressive image models (torch + transformers only)."""
from __future__ import annotations

from .api import generate, generate_batch, list_bundled, load_heads, load_model
from .decoders import DECODERS, ENGINE_DECODERS
from .errors import Cancelled, SSDError
from .heads import DraftHeads
from .hub import hub_file

__all__ = ["DECODERS", "ENGINE_DECODERS", "Cancelled", "DraftHeads", "SSDError", "generate", "generate_batch", "hub_file",
           "list_bundled", "load_heads", "load_model"]
__version__ = "0.1.0"
