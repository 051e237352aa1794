"""Eager ops a step on the compiled path (issue 38's yardstick): the bundled model loaded with compile 'compiled' (CPU
inductor here), each decoder run once to compile, then counted with count_ops(graphs=True): every op a step runs
outside compiled graphs, the forward's preparation and the draft heads' networks included, each graph call one.

    python tools/compiled_ops.py [compiled|static]
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssd_core  # noqa: E402
from ssd_core.opcount import count_ops  # noqa: E402

RUNS = [("ar", {}), ("ssd-exact", {"draft_rows": 1}), ("ssd-exact", {"draft_rows": 2}),
        ("ssd-exact", {"draft_rows": 3}), ("ssd-exact", {"draft_rows": 4}), ("ssd", {})]


def main(argv=None) -> None:
    mode = (argv or sys.argv[1:] or ["compiled"])[0]
    torch.set_num_threads(1)
    model = ssd_core.load_model("reference", compile=mode)
    heads = ssd_core.load_heads("reference", model)
    for decoder, params in RUNS:
        kw = dict(prompt=0, seed=7, decoder=decoder, decode_pixels=False, score=False, **params)
        drafter = None if decoder == "ar" else heads
        t = time.time()
        first = ssd_core.generate(model, drafter, **kw)  # compiles what this decoder's windows need
        warm = time.time() - t
        with count_ops(graphs=True) as c:
            again = ssd_core.generate(model, drafter, **kw)
        assert torch.equal(again.tokens, first.tokens)
        top = ", ".join(f"{k} {v / c.steps:.1f}" for k, v in c.ops.most_common(8))
        print(f"{decoder} {params}: {c.per_step():.1f} eager ops a step ({c.graph_calls / c.steps:.2f} graph "
              f"launches, {c.head_total / c.steps:.1f} in the heads), steps {c.steps}, first run {warm:.0f} s | {top}",
              flush=True)


if __name__ == "__main__":
    main()
