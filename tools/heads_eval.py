"""Held-out expected acceptance of heads files on the bundled model, Hv on fresh and stale inputs:
python -m tools.heads_eval GRIDS.safetensors HEADS.safetensors [HEADS ...]"""
import json, sys, torch, ssd_core
from ssd_core.acceptance import heads_acceptance
from ssd_core.sampling import settings_from
from ssd_core.training import read_grids, collect_features, stale_features
m = ssd_core.load_model('reference')
d = m.defaults
s = settings_from(d)
lay = m.layout(None)
prompts, codes = read_grids(sys.argv[1], m)
h, ids = collect_features(m, prompts, codes, s, lay, 32)
hs = stale_features(m, prompts, h, ids, s, lay, 0.2, 32, 1)[0]
keys = ("expected_acceptance", "expected_acceptance_stale", "horizontal_row0_expected", "horizontal_expected_depth_1-5",
        "horizontal_expected_depth_6-11", "horizontal_expected_depth_12-23", "vertical_expected", "vertical_stale_expected")
for path in sys.argv[2:]:
    heads = ssd_core.load_heads(path, m)
    a = heads_acceptance(m, heads, h, ids, lay, s, h_stale=hs)
    print(path, f"vertical_left {heads.vertical_left}", json.dumps({k: a[k] for k in keys}), flush=True)
