"""The embed stage's one error type."""

from __future__ import annotations


class EmbedError(Exception):
    """A bad input, model, output or setting; the message is one line naming the path/key and the problem."""
