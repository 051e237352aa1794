import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

# Tiny models run fastest on one thread, and a busy machine makes more threads stall each other.
torch.set_num_threads(1)
