"""Sampler settings: temperature / top-k / top-p / min-p, classifier-free guidance, Gumbel noise by (seed, slot)."""
from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import dataclass

import torch

from .errors import SSDError

NEG_INF = float("-inf")
GREEDY_BELOW = 1e-6  # temperatures below this are greedy (a tinier one underflows float32 to 0)


@dataclass(frozen=True)
class SamplerSettings:
    seed: int = 0
    cfg: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0  # keep codes whose prompted (conditional) probability is >= min_p x the top code's

    def __post_init__(self):
        check_seed(self.seed)
        for name in ("cfg", "temperature", "top_k", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise SSDError(f"{name} must be a number, got {str(value)[:40]!r}")
        if not math.isfinite(self.cfg) or self.cfg < 0:
            raise SSDError(f"cfg must be a number >= 0 (1 = no guidance), got {self.cfg}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise SSDError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not math.isfinite(self.top_k) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise SSDError(f"top_k must be a whole number >= 0 (0 = off), got {self.top_k}")
        if not (0 < self.top_p <= 1):
            raise SSDError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not (0 <= self.min_p < 1):
            raise SSDError(f"min_p must be in [0, 1) (0 = off; 0.01 keeps codes the prompt gives at least 1% of "
                           f"its most likely code's probability), got {self.min_p}")

    @property
    def guided(self) -> bool:
        return self.cfg != 1.0


SEEDS = 2**64  # a seed is a whole number from 0 to 2^64 - 1 (ComfyUI's seed widget's range), in every decoder


def check_seed(seed) -> None:
    """The one seed rule: whole numbers 0 .. 2^64 - 1; anything else is refused (never wrapped or truncated)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise SSDError(f"seed must be a whole number from 0 to 2^64 - 1, got {str(seed)[:40]!r}")
    if not 0 <= seed < SEEDS:
        raise SSDError(f"seed must be from 0 to 2^64 - 1 = {SEEDS - 1}, got {str(seed)[:40]}: seeds are not wrapped "
                       "(a negative seed or one of 2^64 or more would otherwise repeat another seed's image)")


SAMPLER_DEFAULTS = {"cfg": 1.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def settings_from(defaults: dict, seed: int = 0, **given) -> SamplerSettings:
    """Sampler settings from a model's defaults (model.defaults) and the values given (None: the default)."""
    v = {k: given[k] if given.get(k) is not None else defaults.get(k, fallback)
         for k, fallback in SAMPLER_DEFAULTS.items()}
    return SamplerSettings(seed=seed, cfg=float(v["cfg"]), temperature=float(v["temperature"]),
                           top_k=v["top_k"], top_p=float(v["top_p"]), min_p=float(v["min_p"]))


def guide(logits: torch.Tensor, cfg: float, min_p: float = 0.0) -> torch.Tensor:
    """[B, ..., V] per-stream logits -> [..., V] guided logits u + s (c - u) (B = 1: unchanged).

    min_p > 0: codes whose conditional probability is below min_p x the conditional top code's get -inf, so
    that guidance only re-ranks codes the prompted model itself finds plausible (without guidance: min-p
    sampling). Strong guidance otherwise lifts codes the model gives almost nothing, and in a raster image one
    such code is copied down the rows below (the reference model's seam and stripe artifact)."""
    cond = logits[0]
    guided = cond if logits.shape[0] == 1 else logits[1] + cfg * (cond - logits[1])
    if min_p > 0:  # p_cond(v) / max p_cond = exp(c_v - max c): the normaliser cancels
        floor = cond.amax(-1, keepdim=True).float() + math.log(min_p)
        guided = guided.masked_fill(cond.float() < floor, NEG_INF)
    return guided


def log_probs(logits: torch.Tensor, s: SamplerSettings, positions: torch.Tensor | None = None,
              raw: torch.Tensor | None = None, source: str = "model", check: bool = True) -> torch.Tensor:
    """Guided logits [n, V] -> log p [n, V] after temperature, top-k and top-p (-inf outside the kept set).

    Temperature 0 (or below GREEDY_BELOW) is greedy: log p is 0 at the argmax and -inf elsewhere. `check`:
    raise on NaN / infinite logits now (one host copy; the engine's Run defers it to its step's sync);
    `positions`, `raw` (the per-stream logits [B, n, V] before guidance) and `source` ("model" or "heads")
    only shape that message.
    """
    if check and not bool(all_rows_finite(logits)):  # one reduction; the slots are found only when wrong
        check_finite(logits, s, positions, raw, source)
    if s.temperature < GREEDY_BELOW:
        out = torch.full_like(logits, NEG_INF)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 0.0)
    if s.temperature < 1:  # shifted so that a tiny temperature gives -inf, never inf - inf = NaN
        x = (logits - logits.max(-1, keepdim=True).values) / s.temperature
    elif s.temperature == 1:
        x = logits
    else:
        x = logits / s.temperature
    if s.top_k and s.top_k < x.shape[-1]:
        kth = x.topk(int(s.top_k), dim=-1, sorted=False).values.amin(-1, keepdim=True)
        x = x.masked_fill(x < kth, NEG_INF)
    if s.top_p < 1.0:
        sorted_x, order = x.sort(-1, descending=True)
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_x.softmax(-1) >= s.top_p  # keep the smallest prefix reaching top_p
        drop_sorted[..., 0] = False  # and always the most likely code (a top_p below float32's range is 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, NEG_INF)
    return x.log_softmax(-1)


def processed(logits: torch.Tensor, s: SamplerSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, n, V] per-stream raw logits -> (guided logits [n, V], processed log p [n, V]): guide(), then log_probs()
    without its finiteness check (the caller makes it, deferred or in the same graph)."""
    guided = guide(logits, s.cfg, s.min_p)
    return guided, log_probs(guided, s, check=False)


def all_rows_finite(logits: torch.Tensor) -> torch.Tensor:
    """0-d bool: every row of logits [..., V] has a finite maximum (no NaN, no +inf, not all -inf); -inf
    entries are codes taken out of the support (min-p)."""
    top = logits.amax(-1)
    return (top - top == 0).all()  # inf - inf and NaN are NaN: isfinite's answer in 2 ops instead of 4


def check_finite(logits: torch.Tensor, s: SamplerSettings, positions=None, raw=None, source: str = "model") -> None:
    """Raise SSDError naming the rows of logits [n, V] that hold NaN / +inf or no finite value (none: return)."""
    bad = ~logits.amax(-1).isfinite()
    if bad.any():
        raise SSDError(not_finite_message(bad, s, positions, raw, source))


def not_finite_message(bad: torch.Tensor, s: SamplerSettings, positions, raw, source: str) -> str:
    """What produced NaN / infinite logits at the rows `bad` [n], and what to try."""
    where = (positions[bad.to(positions.device)] if positions is not None else bad.nonzero().flatten()).tolist()[:8]
    if raw is not None and s.guided and bool(torch.isfinite(raw[..., bad, :]).all()):
        return (f"classifier-free guidance with cfg {s.cfg:g} overflowed to infinite logits at image sequence "
                f"position(s) {where} although the model's own logits are finite: use a smaller cfg (1 to 10 is usual)")
    if source == "heads":
        return (f"the draft heads produced NaN or infinite draft logits at image sequence position(s) {where}: "
                "the heads file is damaged or was trained for another model (re-train or re-load the heads, or "
                "pick a decoder without heads: ar, sjd, scd, sjd-pac, zipar, gsd); if decoder ar fails too, the model is at fault: "
                "try dtype fp32")
    return (f"the model produced NaN or infinite logits at image sequence position(s) {where}: try dtype fp32 "
            "(fp16 overflows on some models) or another device; if that does not help, the model's weights are "
            "damaged: re-download them")


def seeded_generator(seed: int, device=None) -> torch.Generator:
    """A generator (on `device`, default the CPU) keyed by the whole seed (any size or sign): manual_seed
    alone keeps only its low 32 bits."""
    digest = hashlib.blake2b(str(int(seed)).encode(), digest_size=8, person=b"ssd-seed").digest()
    return torch.Generator(device=device or "cpu").manual_seed(int.from_bytes(digest, "little") & 0x7FFFFFFFFFFFFFFF)


def draw(logp: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One independent sample per row of log p [n, V] -> codes [n] (on the generator's device).

    Inverse CDF: the first code whose cumulative probability exceeds a uniform draw (one uniform a row)."""
    return draw_probs(logp.float().exp(), generator)


def draw_probs(p: torch.Tensor, generator: torch.Generator, u: torch.Tensor | None = None) -> torch.Tensor:
    """draw() from probabilities p [n, V] (rows need not sum to 1). u [n, 1]: the uniforms to draw with (made
    earlier by `uniforms`, the very numbers this call would take from the generator), else new ones."""
    p = p.to(generator.device)
    return inverse_cdf(p, uniforms(generator, p.shape[0]) if u is None else u)


def inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """codes [n]: for each row of p [n, V] the first code whose cumulative probability exceeds u [n, 1] x its total."""
    cdf = p.float().cumsum(-1)  # [n, V]
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


def uniforms(generator: torch.Generator, n: int) -> torch.Tensor:
    """[n, 1] uniforms in [0, 1) from the generator: one call for n cells gives the numbers n calls of one each
    give, in order (CPU), so draws can be made before the distributions they pick from are known."""
    return torch.rand(n, 1, generator=generator, device=generator.device)


def sample_logits(logits: torch.Tensor, s: SamplerSettings, generator: torch.Generator) -> torch.Tensor:
    """AR sampling of a batch: raw logits [S, n, V] (S streams: conditional, then unconditional) -> codes [n].

    Guidance when the settings ask for it (else the conditional stream alone), then temperature / top-k /
    top-p, then one draw per row.
    """
    guided = guide(logits if s.guided else logits[:1], s.cfg, s.min_p)
    return draw(log_probs(guided, s, raw=logits), generator)


_MASK64 = (1 << 64) - 1


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors (wrapping arithmetic, logical shifts)."""
    def shr(v, k):
        return (v >> k) & ((1 << (64 - k)) - 1)

    x = x ^ shr(x, 30)
    x = x * _signed(0xBF58476D1CE4E5B9)
    x = x ^ shr(x, 27)
    x = x * _signed(0x94D049BB133111EB)
    return x ^ shr(x, 31)


def _signed(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def gumbel(seed: int, slots: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise [n, V] on the slots' device that depends only on (seed, slot, code): a counter-based
    generator.

    The same (seed, slot) gives the same noise in every decoder and every window, so Gumbel-max sampling
    is a deterministic function of the seed; only the slots asked for are ever materialised.
    """
    codes = torch.arange(vocab, dtype=torch.long, device=slots.device)
    return gumbel_of(gumbel_bits(gumbel_key(seed), slots, codes))  # the key a host number: no device copy


def gumbel_key(seed: int) -> int:
    """The seed's key of the noise (a signed 64-bit number)."""
    return _mix_int(_signed(seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019))


def gumbel_bits(key, slots: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """[n, V] whole numbers in [0, 2^53) of (key, slot, code): what gumbel_of turns into the noise. key: gumbel_key's
    number, or it as a 0-d int64 tensor (a compiled region's input: integer arithmetic, so compiled and eager agree
    bit for bit; the logs of gumbel_of stay eager, where a compiled log could round another way)."""
    base = _mix(key ^ (slots.long() * _signed(0xD1B54A32D192ED03)))
    return shr53(_mix(base[:, None] + codes[None, :] * _signed(0x9E3779B97F4A7C15)))


def gumbel_of(m: torch.Tensor) -> torch.Tensor:
    """float32 -log(-log(u)) of u = (m + 1/2) / 2^53 for whole numbers m [..] in [0, 2^53), without float64
    (Apple's mps has none): -log(u) comes from u itself below 1/2 and from 1 - u, an exact whole number
    before it is rounded, above (log1p), so the Gumbel tail that decides an argmax keeps float32's precision.
    Within a few float32 ulps of the float64 formula."""
    half = 1 << 52
    u = (m.float() + 0.5) * 2.0 ** -53  # uniform in (0, 1)
    rest = (((1 << 53) - m).float() - 0.5) * 2.0 ** -53  # 1 - u
    e = torch.where(m < half, -torch.log(u), -torch.log1p(-rest))  # -log(u) > 0
    return -torch.log(e)


def _mix_int(x: int) -> int:
    """_mix on one signed 64-bit number."""
    x &= _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    return _signed(x ^ (x >> 31))


def shr53(bits: torch.Tensor) -> torch.Tensor:
    return (bits >> 11) & ((1 << 53) - 1)


def gumbel_argmax(logp: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """x = argmax(log p + g): an exact sample of p, coupled across calls through the noise."""
    return (logp + noise).argmax(-1)


def acceptance(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) [n] for tokens x [n] drawn from q [n, V], checked against the verifier's p [n, V]."""
    ratio = p.gather(1, tokens[:, None]).squeeze(1) / q.gather(1, tokens[:, None]).squeeze(1).clamp(min=1e-30)
    return ratio.clamp(max=1.0)


def rejected(u: torch.Tensor, p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[n] bool: tokens x [n] drawn from q [n, V] rejected under p [n, V] by uniforms u [n] in [0, 1):
    u >= min(1, p(x) / q(x)), computed as u >= p(x) / q(x) (the same decision, as u < 1)."""
    return u >= p.gather(1, tokens[:, None]).squeeze(1) / q.gather(1, tokens[:, None]).squeeze(1).clamp(min=1e-30)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p where p == q (the rejection then has probability 0)."""
    return residual_and_mass(p, q)[0]


def residual_and_mass(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual(p, q) [n, V], its mass sum_v max(0, p - q) [n, 1]): the mass is the rejection probability of a
    draft x ~ q, 1 - sum_v min(p, q), so it gives the expected acceptance at no cost."""
    r = (p - q).clamp(min=0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 1e-12, r / total.clamp(min=1e-30), p), total
