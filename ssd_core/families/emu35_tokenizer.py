"""Emu3.5's tokenizer read from its released files, without tiktoken and without its remote code.

Emu3.5 ships its tokenizer in baaivision/Emu3.5 src/tokenizer_emu3_ibq (tokenization_emu3.py, Emu3Tokenizer over
tiktoken): `emu3.tiktoken` (one "base64(token bytes) rank" line per BPE token: Qwen's 151,643), then special tokens
numbered from 151643 (SPECIAL_START_ID): `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|extra_0|>` ..
`<|extra_204|>`, and the lines of `emu3_vision_tokens.txt` (`<|image token|>`, `<|image start|>`, `<|image end|>`,
`<|visual token 000000|>` ...). Its encode is tiktoken's with every special allowed in the text
(Emu3Tokenizer.tokenize: NFC-normalised, allowed_special="all"): special tokens split the text, the rest is cut by
PAT_STR and each piece byte-pair merged, lowest rank first. This module does the same in plain Python (the
`regex` package transformers already needs reads PAT_STR's \\p{L} / \\p{N}); tests/test_family_emu35.py checks it
against tiktoken itself.
"""
from __future__ import annotations

import base64
import os
import unicodedata
from pathlib import Path

import regex

from ..errors import SSDError

VOCAB_FILE = "emu3.tiktoken"
VISION_FILE = "emu3_vision_tokens.txt"
FILES = (VOCAB_FILE, VISION_FILE)
SUBFOLDER = "tokenizer_emu3_ibq"  # the release's folder name: accepted inside the model folder too
PAT_STR = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
           r"""\s+(?!\S)|\s+""")  # tokenization_emu3.py PAT_STR
SPECIAL_START_ID = 151643  # tokenization_emu3.py: "use actual index"
BASE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + tuple(f"<|extra_{i}|>" for i in range(205))
SPECIAL_CANDIDATE = regex.compile(r"<\|[^|]*\|>")  # every special is <|...|> with no '|' inside


def tokenizer_folder(folder) -> Path | None:
    """Where a model folder keeps the tokenizer files: the folder itself, or its tokenizer_emu3_ibq/."""
    for where in (Path(folder), Path(folder) / SUBFOLDER):
        if all((where / n).is_file() for n in FILES):
            return where
    return None


class Emu35Tokenizer:
    """encode / decode / convert_tokens_to_ids over emu3.tiktoken + emu3_vision_tokens.txt, as Emu3Tokenizer."""

    bos_token, eos_token, pad_token = "<|extra_203|>", "<|extra_204|>", "<|endoftext|>"  # model_utils.build_emu3p5
    unk_token_id = None

    def __init__(self, ranks: dict[bytes, int], specials: list[str]):
        self.ranks = ranks  # BPE token bytes -> id
        self.special_ids = {name: SPECIAL_START_ID + i for i, name in enumerate(specials)}
        self.decoder = {i: t for t, i in ranks.items()}
        self.decoder.update({i: n.encode() for n, i in self.special_ids.items()})
        self.pattern = regex.compile(PAT_STR)

    @classmethod
    def from_folder(cls, folder) -> "Emu35Tokenizer":
        where = tokenizer_folder(folder)
        if where is None:
            raise SSDError(f"{folder} lacks Emu3.5's tokenizer files ({' and '.join(FILES)}): copy them from "
                           f"baaivision/Emu3.5 src/{SUBFOLDER}/ on GitHub into the model folder")
        return cls(read_ranks(where / VOCAB_FILE), BASE_SPECIALS + tuple(read_lines(where / VISION_FILE)))

    # ---- the transformers-tokenizer surface the families use ----------------------------------------------------
    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self.encode(text)}

    @property
    def bos_token_id(self) -> int:
        return self.special_ids[self.bos_token]

    @property
    def eos_token_id(self) -> int:
        return self.special_ids[self.eos_token]

    @property
    def pad_token_id(self) -> int:
        return self.special_ids[self.pad_token]

    def convert_tokens_to_ids(self, name):
        if isinstance(name, (list, tuple)):
            return [self.convert_tokens_to_ids(n) for n in name]
        return self.special_ids.get(name, self.ranks.get(name.encode() if isinstance(name, str) else name))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """tiktoken's encode(NFC(text), allowed_special="all") on Emu3.5's vocabulary."""
        text = unicodedata.normalize("NFC", text)
        ids: list[int] = []
        start = 0
        for m in SPECIAL_CANDIDATE.finditer(text):
            sid = self.special_ids.get(m.group())
            if sid is None:
                continue
            ids += self._encode_ordinary(text[start:m.start()])
            ids.append(sid)
            start = m.end()
        return ids + self._encode_ordinary(text[start:])

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out = b"".join(self.decoder[int(i)] for i in ids
                       if not (skip_special_tokens and int(i) >= SPECIAL_START_ID))
        return out.decode("utf-8", errors="replace")

    # ---- byte-pair encoding, as tiktoken's ---------------------------------------------------------------------
    def _encode_ordinary(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self.pattern.findall(text):
            b = piece.encode("utf-8")
            rank = self.ranks.get(b)
            ids += [rank] if rank is not None else self._merge(b)
        return ids

    def _merge(self, piece: bytes) -> list[int]:
        """tiktoken's byte_pair_merge: merge the adjacent pair whose joined bytes rank lowest (the leftmost on a
        tie) until no joined pair is a token; each part is then a token."""
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = self.ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        try:
            return [self.ranks[p] for p in parts]
        except KeyError:
            raise SSDError(f"{VOCAB_FILE} has no token for the byte {parts[0]!r}: the file is not Emu3.5's "
                           "(it lacks single bytes); copy it again from baaivision/Emu3.5") from None


def read_lines(path: Path) -> list[str]:
    """The non-empty stripped lines of a text file (emu3_vision_tokens.txt)."""
    return [line.strip() for line in _read_text(path).splitlines() if line.strip()]


def read_ranks(path: Path) -> dict[bytes, int]:
    """emu3.tiktoken: "base64 rank" a line -> {token bytes: rank}; one clear line for a damaged file."""
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line:
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError
            token, rank = base64.b64decode(fields[0], validate=True), int(fields[1])
        except ValueError:
            raise SSDError(f"{path} line {n} is not 'base64 rank': it is not a tiktoken vocabulary; copy it again "
                           f"from baaivision/Emu3.5 src/{SUBFOLDER}/") from None
        ranks[token] = rank
    if not ranks:
        raise SSDError(f"{path} is empty; copy it again from baaivision/Emu3.5 src/{SUBFOLDER}/")
    return ranks


def _read_text(path: Path) -> str:
    try:
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SSDError(f"could not read {path} ({type(err).__name__}); copy it again from baaivision/Emu3.5 "
                       f"src/{SUBFOLDER}/") from None
