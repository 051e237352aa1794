"""`sjd-pac` (peer): SJD-PAC, speculative Jacobi decoding with proactive drafting and adaptive continuation (Kang,
Shu, Li, Zhai, Chen, CVPR 2026, arXiv 2603.18599), as KangJialiang/SJD-PAC releases it for Lumina-mGPT
(scheduler/sjd_pac_iteration_lumina_mgpt.py). Lossless: the AR distribution.

- Window: 64 tokens a forward (max_num_new_tokens = 64 in SJDPACSampler._init_new_params and test_lumina_mgpt.py;
  eval_model.py's flag defaults to 16), counted as the file counts them: the root (the last final token), the main
  path and the tree's side branches. New slots start as uniform random codes, q uniform
  (get_multi_token_for_preparation).
- Proactive drafting: the first D - 1 open slots get K candidates each, and the forward feeds the K-ary tree of them
  (generate_tree_mask_and_retrieve: K = tree_width = 3, D = tree_depth = 3 in _init_new_params, test_lumina_mgpt.py
  and eval_model.py; the README's prose says K = 4, its list of knobs 3): the main path is the window, the side
  branches are fed after it (run.Branches), each seeing its own ancestors only. A layer's candidates are tested in
  turn by recursive rejection sampling (SJDPACSpeculativeSampler.__call__): candidate k against the residual left by
  candidates 0..k-1, with q_k = q without candidates 0..k-1, renormalized (the file's `q[b_idx, c_idx, parent_tkn]
  = 0`, `p_curr = norm(p_prev - q_prev)`); after a layer rejects all K, the token is drawn from the last residual.
  Past an accepted side leaf the next token is drawn from the leaf's own output; past the main path SJD goes on
  along the window.
- Adaptive continuation: after the first rejection the window's later drafts are still checked, each against its own
  (now stale) p from this forward: a draft that passes stays, one that fails is redrawn from norm(max(0, p - q)), and
  either way p becomes its q (the file's rej_vector / st_view / res_p). Such a token is a draw of the stale p, coupled
  to the old draft (maximal coupling), so the next check of it is exact again.

Where the pack differs from the file, to stay lossless (tests/test_peers.py checks the output distribution):
candidates 1..K-1 of a slot are drawn from its q without replacement (Gumbel top-k), which is what the recursive
test assumes; the file draws them from the residual of the continuation check (torch.multinomial(res_p, K)) and
still tests them against q without the earlier candidates. A layer takes its first candidate that passes, as
recursive rejection sampling does; the file takes the longest accepted path over all leaves (torch.max over
accepted_lengths), which can pick a later sibling although an earlier one passed. The tree spans image slots only:
it is cut short before a forced token (a row end), which the pack never drafts.
"""
from itertools import product

import torch

from ..run import Branches, Policy, Run
from ..sampling import acceptance, residual
from .drafting import WindowDrafter

TREE_WIDTH = 3  # K: candidates a tree layer (tree_width)
TREE_DEPTH = 3  # D: the tree's depth with its root (tree_depth): D - 1 layers of K candidates


def side_nodes(width: int = TREE_WIDTH, depth: int = TREE_DEPTH) -> int:
    """Nodes of the draft tree off the main path: (K^D - 1) / (K - 1) tree nodes less the main path's D."""
    return sum(width ** level for level in range(depth)) - depth


def candidates(q: torch.Tensor, first: torch.Tensor, width: int, generator: torch.Generator):
    """K candidates per slot: `first` [T] (the slot's draft, a draw of q [T, V]), then K - 1 draws of q without
    replacement (Gumbel top-k over log q with the first left out). -> codes [T, K], valid [T, K] (False where q has
    fewer codes than K)."""
    T, V = q.shape
    u = torch.rand(T, V, generator=generator, device=generator.device).to(q.device).clamp(min=1e-20)
    keys = q.float().log().scatter(1, first[:, None], float("-inf")) - (-u.log()).log()
    top = keys.topk(width - 1, dim=-1)
    ones = torch.ones(T, 1, dtype=torch.bool, device=q.device)
    return torch.cat([first[:, None], top.indices], 1), torch.cat([ones, top.values > float("-inf")], 1)


def recursive_accept(p: torch.Tensor, q: torch.Tensor, cand: torch.Tensor, valid: torch.Tensor, u: torch.Tensor):
    """One tree layer's test, per row: p [P, V] the verifier's, q [P, V] the candidates' draft distribution, cand
    [P, K] drawn from q without replacement (valid [P, K]), u [P, K] uniforms. Candidate k is kept if u_k < p_k(c_k) /
    q_k(c_k), q_k = q without the earlier candidates (renormalized), p_k = p, then the residual norm(max(0, p_k -
    q_k)) after each rejection. -> (the kept candidate's index [P], K where none passed; the last residual [P, V],
    what the token is drawn from then). The kept candidate, else a draw of the residual, is a draw of p."""
    P, K = cand.shape
    kept = torch.full((P,), K, dtype=torch.long, device=p.device)
    removed = torch.zeros_like(q, dtype=torch.bool)
    rows = torch.arange(P, device=p.device)
    for k in range(K):
        qk = q.masked_fill(removed, 0.0)
        qk = qk / qk.sum(-1, keepdim=True).clamp(min=1e-30)
        c = cand[:, k]
        searching = (kept == K) & valid[:, k]
        ok = searching & (u[:, k] < acceptance(p, qk, c))
        kept = torch.where(ok, k, kept)
        p = torch.where((searching & ~ok)[:, None], residual(p, qk), p)
        removed[rows, c] |= valid[:, k]
    return kept, p


class SJDPACPolicy(Policy):
    name = "sjd-pac"

    def __init__(self, window: int):  # decoders.make_policy passes every parameter (DECODER_SPECS' defaults)
        self.window = window
        self.width, self.depth = TREE_WIDTH, TREE_DEPTH

    def begin(self, run: Run) -> None:
        main = max(1, self.window - 1 - side_nodes(self.width, self.depth))  # the root, the main path, the side
        self.drafter = WindowDrafter(main, above=False, random_q="uniform")
        self.tree = None  # this step's tree: (first open rank, layers, candidates, valid, branch index by path)

    def branches(self, run: Run) -> Branches | None:
        """The tree over the first open slots (image slots in a row, no forced one between), fed after the window."""
        self.tree = None
        a, b = run.window.open_span(run.window.cached, run.window.end)
        slots = run.index.image_slots
        s0 = slots[a] if a < b else None
        T = 0
        while s0 is not None and T < min(self.depth - 1, b - a) and slots[a + T] == s0 + T:
            T += 1
        if T == 0:
            return None
        first = run.tokens.codes[run.index.image_ids[a:a + T]]
        cand, valid = candidates(run.draws.q_at(a, a + T), first, self.width, run.draws.rng)
        paths = [path for level in range(1, T + 1) for path in product(range(self.width), repeat=level) if any(path)]
        self.tree = (a, T, cand, valid, {path: i for i, path in enumerate(paths)})
        if not paths:
            return None
        index = self.tree[4]
        layer = torch.tensor([len(path) - 1 for path in paths], device=cand.device)
        branch = torch.tensor([path[-1] for path in paths], device=cand.device)
        return Branches(ids=run.index.id_of_code[cand[layer, branch]], slots=tuple(s0 + len(p) - 1 for p in paths),
                        sees=tuple(s0 + next(i for i, d in enumerate(p) if d) for p in paths),
                        parent=tuple(index.get(p[:-1], -1) for p in paths))

    def update(self, run: Run, logits, features) -> None:
        win = run.window
        C = win.cached
        a, b = win.open_span(C, win.end)
        tree, self.tree = self.tree, None
        whole = b == a or self._check(run, logits, a, b, tree if tree is not None and tree[0] == a else None)
        if whole and win.final_end >= win.end and win.end < run.index.L and win.end - C < logits.shape[1]:
            s = win.end  # the token after a window kept whole (every token as fed): an exact draw
            one = run.index.slots(s, s + 1)
            run.tokens.write(one, run.draws.sample(run.logp(logits[:, s - C:s - C + 1], one)), draft=False)
            run.tokens.finalize(one)
            win.advance(s + 1)
            win.set_end(s + 1)
        self.drafter.draft(run, run.index.L)

    def _check(self, run: Run, logits, a: int, b: int, tree) -> bool:
        """Check the open slots of ranks [a, b) (tree: this step's, or None) -> whether every one was kept as fed
        (then the window's last output is the next token's exact p)."""
        C, n, K = run.window.cached, b - a, self.width
        slots = run.index.image_ids[a:b]
        p = run.logp(logits[:, slots - C], slots).exp()  # [n, V] each open slot's p along the window (main path)
        q = run.draws.q_at(a, b)
        tok = run.tokens.codes[slots]
        order = run.index.slot_ids[:n]
        T = 0 if tree is None else tree[1]
        zero = order.new_zeros(())
        alive, node, depth = torch.ones((), dtype=torch.bool, device=p.device), zero, zero
        codes_tree = []
        if T:
            _, _, cand, valid, index = tree
            s0 = run.index.image_slots[a]
            outs = [lp.exp() for lp in self._node_logp(run, logits, s0, T, index)]  # per layer: [K^l, V] its p
            for level in range(1, T + 1):
                parents = outs[level - 1]
                P = parents.shape[0]
                kept, rest = recursive_accept(parents, q[level - 1].expand(P, -1), cand[level - 1].expand(P, -1),
                                              valid[level - 1].expand(P, -1), run.draws.uniform(P * K).view(P, K))
                k = kept[node]
                drawn = run.draws.sample_probs(rest[node][None])[0]  # the residual's draw, used where none passed
                took = alive & (k < K)
                codes_tree.append(torch.where(took, cand[level - 1][k.clamp(max=K - 1)], drawn))
                depth = depth + took.long()
                node = torch.where(took, node * K + k.clamp(max=K - 1), node)
                alive = took
            main = node == 0
            # past an accepted side leaf: the next slot (if it is the next image slot) from the leaf's own output
            bonus_ok = T < n and run.index.image_slots[a + T] == s0 + T
            bonus = run.draws.sample_probs(outs[T][node][None])[0] if bonus_ok else None
        else:
            main = torch.ones((), dtype=torch.bool, device=p.device)
            bonus_ok, bonus = False, None
        # along the window past the tree (the main path): SJD's prefix test, the first rejected one from the residual
        ok = run.draws.uniform(n) < acceptance(p, q, tok)
        chain = (ok | (order < T)).long().cumprod(0).sum() - T  # accepted past the tree
        fix = run.draws.sample_probs(residual(p, q))
        # adaptive continuation: every later draft checked against its stale p: kept, or redrawn from the residual
        cont = torch.where(run.draws.uniform(n) < acceptance(p, q, tok), tok, run.draws.sample_probs(residual(p, q)))
        on_main = alive & main
        n_final = torch.where(~alive, depth + 1, torch.where(
            main, T + chain + (chain < n - T).long(), T + int(bonus_ok)))
        final = order < n_final
        codes = torch.where(on_main & (order >= T) & final, torch.where(order - T < chain, tok, fix), cont)
        if T:
            codes[:T] = torch.where(final[:T], torch.stack(codes_tree), codes[:T])
            if bonus_ok:
                codes[T] = torch.where(alive & ~main, bonus, codes[T])
        run.tokens.write(slots, codes, draft=~final)
        run.tokens.finalize(slots, final)
        run.draws.put_q(a, p)  # the continued drafts are draws of their stale p (the final ones are not read again)
        n_host, whole = run.sync(n_final, on_main & (chain == n - T))
        run.window.advance(run.index.image_slots[a + min(n_host, n) - 1] + 1)
        return bool(whole)

    def _node_logp(self, run: Run, logits, s0: int, T: int, index: dict) -> list[torch.Tensor]:
        """log p after every tree node, by layer 0..T: [K^l, V], nodes in path order (base-K digits); a main-path
        node's from the window's logits, a side node's from its branch's."""
        C, K = run.window.cached, self.width
        raw, where = [], []
        for level in range(T + 1):
            for path in product(range(K), repeat=level):
                raw.append(logits[:, s0 + level - C] if not any(path) else run.outputs.branch_logits[:, index[path]])
                where.append(s0 + level)
        logp = run.logp(torch.stack(raw, 1), torch.tensor(where, device=logits.device))
        sizes = [K ** level for level in range(T + 1)]
        return list(logp.split(sizes))
