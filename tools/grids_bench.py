"""train-heads' grid sampling (batched AR with CFG) on the static cache, as it runs, against the same loop on
the dynamic cache: python -m tools.grids_bench [N] (N grids in one batch, default 32; bundled model)."""
import sys, time

import ssd_core
from ssd_core.training import data as train
from ssd_core.sampling import settings_from

m = ssd_core.load_model("reference")
lay = m.layout(None)
d = m.defaults
s = settings_from(d, 3)
prompts = [i % 11 for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 32)]
codes = {}
for name, sample in (("dynamic cache", train._sample_grids), ("static cache (train-heads)", train.generate_grids)):
    t = time.time()
    codes[name] = sample(m, prompts, s, lay, len(prompts), lambda *_: None)
    dt = time.time() - t
    print(f"{name}: {dt:.1f} s, {dt / len(prompts):.2f} s per grid", flush=True)
a, b = codes.values()
print("same grids:", bool((a == b).all()))
