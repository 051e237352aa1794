"""A draft tree for ssd-exact, measured (issue 37: sjd-pac's proactive tree, tried on the exact rule): at each of
the first `depth` open slots of a check, the K - 1 runner-up codes of the Gumbel pick its draft came from are fed
as side branches (run.Branches, as sjd-pac feeds its tree), each followed by an Hh chain of `chain` drafts. Where
the main draft misses and a runner-up is ar's pick, that branch's outputs make its chain's leading matches and one
more token final in the same step. Every token is still the verifier's Gumbel pick under a final context, so the
image stays ar's (the tool checks it).

    python tools/exact_tree.py --rows 4 --images 16 --seed 5000 [--width 3] [--chain 4] [--depth 1] [--json out.json]

It prints and returns the median steps of ssd-exact at `rows` with and without the tree, on the same images.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ssd_core  # noqa: E402
from ssd_core.decoders import exact  # noqa: E402
from ssd_core.decoders.drafting import _embed_codes, feature  # noqa: E402
from ssd_core.engine import Generation, decode_batch  # noqa: E402
from ssd_core.run import Branches  # noqa: E402
from ssd_core.sampling import gumbel_argmax, settings_from  # noqa: E402


class TreeExact(exact.ExactPolicy):
    """ssd-exact at a fixed number of rows with runner-up branches at its first `depth` open slots."""

    def __init__(self, rows: int, width: int, chain: int, depth: int, record: Counter):
        super().__init__(rows)
        self.width, self.chain, self.depth, self.record = width, chain, depth, record

    def begin(self, run) -> None:
        super().begin(run)
        self.tree, self.runners_up = None, {}  # image rank -> [K] the top codes of its latest Gumbel pick
        pick = run.draws.gumbel_sample

        def gumbel_sample(logp, a, b):  # every exact pick (drafts, re-drafts, verdicts): keep its runners-up
            codes = pick(logp, a, b)  # (makes the slots' noise first)
            if run.settings.temperature != 0:
                top = (logp.float() + run.draws.noise.get(a, b)).topk(self.width, dim=-1).indices
                self.runners_up.update({a + i: top[i] for i in range(b - a)})
            return codes
        run.draws.gumbel_sample = gumbel_sample

    def branches(self, run):
        """Per depth d (slot s0 + d of the first open rank's row): K - 1 runners-up, each with an Hh chain."""
        self.tree = None
        win, idx, toks = run.window, run.index, run.tokens
        a, b = win.open_span(win.cached, win.end)
        if b <= a or run.heads is None:
            return None
        s0 = idx.image_slots[a]
        stride, W = run.layout.row_stride, run.layout.grid[1]
        row0 = (s0 // stride) * stride
        if s0 == row0:  # the first cell of a row follows a row end: no Hh feature before it here
            return None
        nodes, parents, slots, plan = [], [], [], {}
        for d in range(self.depth):
            s, r = s0 + d, a + d
            if s >= min(row0 + W - 1, win.end - 1):
                break
            top = self.runners_up.get(r)
            if top is None or int(top[0]) != int(toks.codes[idx.image_ids[r]]):
                break
            n_pred = min(self.chain + 1, row0 + W - 1 - s, win.end - 1 - s)  # outputs along the branch
            k = s - 1
            if d == 0 and int(toks.verified[k]) <= int(toks.value_seen[k]):  # a corrected token not fed yet
                token = _embed_codes(run, toks.codes[k:k + 1])[0]
                prev = run.call_heads(run.heads.horizontal, feature(run, k - 1), token)
            else:
                prev = feature(run, k)
            for j in range(1, self.width):
                f = run.call_heads(run.heads.horizontal, prev, _embed_codes(run, top[j:j + 1])[0])
                codes, feats = [top[j:j + 1]], [f]
                for i in range(1, n_pred):
                    logp = run.draft_logp(f[:, None], idx.slots(s + i, s + i + 1))
                    codes.append(gumbel_argmax(logp.float(), run.draws.noise.get(r + i, r + i + 1)))
                    if i < n_pred - 1:
                        f = run.call_heads(run.heads.horizontal, f, _embed_codes(run, codes[-1])[0])
                        feats.append(f)
                first = len(nodes)
                for i, code in enumerate(codes):
                    nodes.append(code)
                    parents.append(-1 if i == 0 else first + i - 1)
                    slots.append(s + i)
                plan.setdefault(d, []).append((int(top[j]), first, torch.cat(codes), torch.stack(feats, 1), n_pred))
        if not nodes:
            return None
        self.tree = (a, s0, plan)
        return Branches(ids=idx.id_of_code[torch.cat(nodes)], slots=tuple(slots),
                        sees=tuple(s0 + d for d in plan for _, first, codes, _, _ in plan[d] for _ in codes),
                        parent=tuple(parents))

    def update(self, run, logits, features) -> None:
        tree, self.tree = self.tree, None
        win, idx = run.window, run.index
        a0 = win.open_span(win.cached, win.end + 1)[0]
        latest = exact.verify(run, logits, self.drafter)
        if tree is not None and tree[0] == a0:
            a, s0, plan = tree
            d = idx.images_before[win.final_end] - a - 1  # where the main path's first mismatch is
            self.record["checks with a tree"] += 1
            if d in plan:
                self.record[f"miss at depth {d}"] += 1
                r = a + d
                hit = [p for p in plan[d] if p[0] == int(run.tokens.codes[idx.image_ids[r]])]
                if hit:
                    _, first, codes, feats, n_pred = hit[0]
                    raw = run.outputs.branch_logits[:, first:first + n_pred]  # predicting slots s + 1 .. s + n_pred
                    slots = idx.image_ids[r + 1:r + 1 + n_pred]
                    logp = run.logp(raw, slots)
                    verdict = run.draws.gumbel_sample(logp, r + 1, r + 1 + n_pred)
                    n_final = int((verdict[:n_pred - 1] == codes[1:n_pred]).long().cumprod(0).sum()) + 1
                    run.tokens.write(slots[:n_final], verdict[:n_final], draft=False)
                    run.tokens.finalize(slots[:n_final])
                    run.note_near_ties(raw, logp, r + 1, n_final)
                    self.record[f"hit at depth {d}"] += 1
                    self.record["tokens from branches"] += n_final
                    last = idx.image_slots[r + n_final]
                    run.outputs.set_features(slice(s0 + d, s0 + d + feats.shape[1]), feats)
                    win.advance(last + 1)
                    if not win.done:
                        self.drafter.corrected(run, last)
        if not win.done:
            self.drafter.draft(run, exact.rows_end(run, win.final_end, self.rows), latest)


def run_one(model, heads, policy, cls: int, seed: int, layout):
    """One image of class `cls` at the model's defaults -> (its tokens, its steps)."""
    settings = settings_from(model.defaults, seed)
    prompt = model.build_prompt(cls, "", settings.guided, layout.grid)
    (_, trace), = decode_batch(model, heads, [prompt], layout, [settings], [policy], Generation(score=False))
    return trace.tokens, trace.steps


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="reference")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--seed", type=int, default=5000)
    ap.add_argument("--width", type=int, default=3, help="K: the main draft and K - 1 runners-up")
    ap.add_argument("--chain", type=int, default=4, help="Hh drafts after each runner-up")
    ap.add_argument("--depth", type=int, default=1, help="open slots that get runners-up")
    ap.add_argument("--grid", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    model = ssd_core.load_model(a.model)
    heads = ssd_core.load_heads(a.model, model)
    layout = model.layout(tuple(int(x) for x in a.grid.split("x")) if a.grid else None)
    record, plain, tree, same = Counter(), [], [], 0
    for i in range(a.images):
        prompt, seed = i % len(model.class_names), a.seed + i
        with torch.no_grad():
            ar_tokens, _ = run_one(model, None, ssd_core.decoders.make_policy("ar"), prompt, seed, layout)
            _, plain_steps = run_one(model, heads, exact.ExactPolicy(a.rows), prompt, seed, layout)
            tokens, steps = run_one(model, heads, TreeExact(a.rows, a.width, a.chain, a.depth, record), prompt, seed,
                                    layout)
        plain.append(plain_steps)
        tree.append(steps)
        same += bool(torch.equal(tokens, ar_tokens))
        print(f"image {i}: ssd-exact@{a.rows} {plain_steps} steps, with the tree {steps}", flush=True)
    out = {"model": a.model, "grid": list(layout.grid), "rows": a.rows, "images": a.images, "seed": a.seed,
           "width": a.width, "chain": a.chain, "depth": a.depth,
           "steps_median": statistics.median(plain), "tree_steps_median": statistics.median(tree),
           "steps_mean": statistics.mean(plain), "tree_steps_mean": statistics.mean(tree),
           "same_as_ar": same, "record": dict(record)}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
