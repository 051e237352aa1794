"""The engine's own exceptions: every bad input is an SSDError with a message that says how to fix it."""


class SSDError(ValueError):
    """A bad input or an unusable file: the message says what is wrong and what to do."""


class Cancelled(RuntimeError):
    """The caller's should_cancel() returned True; the model is left ready for the next run."""
