"""The engine's own exceptions: every bad input is an SSDError with a message that says how to fix it.

Messages quote what users and files hand us (names, paths, metadata), so they never carry raw control or
bidirectional-override characters: `shown` quotes a value repr-style and cut, `printable` escapes what a
message text holds, and SSDError applies `printable` to every message (one line, nothing a terminal obeys).
"""
import contextlib


def printable(text: str) -> str:
    """`text` with every character that is not printable (control characters such as NUL, newline or ESC;
    format characters such as the right-to-left override U+202E; separators other than the space) written as
    its escape (\\n, \\x1b, \\u202e)."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def shown(value, limit: int = 60) -> str:
    """An untrusted value as it goes into a message: repr-style (quotes, escapes), cut to about `limit`."""
    text = printable(repr(value))
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def a_or_an(text) -> str:
    """`text` after the article it takes when read aloud: 'an 8x8 grid', 'an 11x11 grid', 'a 24x24 grid',
    'an emu3 model', 'a janus model' (a leading quote or bracket is skipped; a number is read as a number)."""
    text = str(text)
    word = text.lstrip("'\"`([")
    digits = len(word) - len(word.lstrip("0123456789"))
    if digits:  # eight, eleven, eighteen (and eleven / eighteen thousand) begin with a vowel sound
        vowel = word[0] == "8" or (word[:2] in ("11", "18") and digits % 3 == 2)
    else:
        vowel = word[:1].lower() in ("a", "e", "i", "o", "u")
    return ("an " if vowel else "a ") + text


def reason(err: BaseException, limit: int = 200, empty: str | None = None, fold: bool = False) -> str:
    """Why a library call failed, for a message: the first non-empty line of the exception's text (fold: all its
    lines, joined by spaces, for errors whose first line says little, e.g. torch's load_state_dict), cut to `limit`;
    or `empty` (default: the exception type's name) when it has no text (safetensors, json and torch raise several
    kinds)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = (" ".join(str(err).split()) if fold else lines[0]) if lines else empty or type(err).__name__
    return text[:limit]


class SSDError(ValueError):
    """A bad input or an unusable file: the message says what is wrong and what to do."""

    def __init__(self, message="", *args):
        super().__init__(printable(message) if isinstance(message, str) else message, *args)


class Cancelled(RuntimeError):
    """The caller's should_cancel() returned True; the model is left ready for the next run."""


# torch's NotImplementedError for an op without an mps kernel ("The operator 'aten::x' is not currently implemented
# for the MPS device. ...", or the dispatcher's "Could not run 'aten::x' with arguments from the 'MPS' backend")
MPS_MISSING = ("not currently implemented for the MPS device", "from the 'MPS' backend")


def missing_mps_op(err: BaseException) -> "SSDError | None":
    """torch's error for an op Apple's mps backend lacks, as one SSDError line saying which op and what to do;
    None for any other error."""
    import re

    text = str(err)
    if not any(phrase in text for phrase in MPS_MISSING):
        return None
    found = re.search(r"(?:operator|run) '?([\w.:]+)'?", text)
    op = found.group(1) if found else "an operator this model uses"
    return SSDError(f"torch has no Apple GPU (mps) kernel for {op}: quit, set the environment variable "
                    "PYTORCH_ENABLE_MPS_FALLBACK=1 and start again (ComfyUI or python; that op then runs on the "
                    "CPU), or choose device cpu")


@contextlib.contextmanager
def mps_op_errors():
    """Turn torch's "not currently implemented for the MPS device" into one SSDError line (missing_mps_op)."""
    try:
        yield
    except (NotImplementedError, RuntimeError) as err:
        mapped = missing_mps_op(err)
        if mapped is None:
            raise
        raise mapped from err
