"""Control characters in text: which count as whitespace, for the shard and embed stages alike.

Unicode category Cc (U+0000-U+001F, U+007F-U+009F) except tab, line feed and carriage return becomes
a space before tokenization (docs/encoding.md#from-text-to-tokens), so ``a\\x00b`` is the two
tokens ``a`` and ``b`` and no token or vocabulary entry ever holds one. The model is trained on text
read this way, so the embed stage reads its input by the same rule.
"""

from __future__ import annotations

import re

CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""The control characters that count as whitespace: Unicode category Cc except tab (``\\t``), line
feed (``\\n``, the line end) and carriage return (``\\r``, the CR of CRLF files)."""

_C0_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
"""The UTF-8 bytes of :data:`CONTROL_CHARS` below U+0080: each is one byte of its own."""
_C1_BYTES = re.compile(rb"\xc2[\x80-\x9f]")
"""The UTF-8 encoding of U+0080-U+009F."""


def replace_control_chars(text: str) -> tuple[str, bool]:
    """``text`` with every :data:`CONTROL_CHARS` character replaced by a space, and whether it had any."""
    if CONTROL_CHARS.search(text) is None:
        return text, False
    return CONTROL_CHARS.sub(" ", text), True


def may_hold_control_chars(data: bytes) -> bool:
    """False when no line of ``data`` can hold a :data:`CONTROL_CHARS` character: about 1 ms per
    MiB (measured: 4 ms of a 4 MiB chunk's 240 ms with the whitespace tokenizer), so the common case
    skips the per-line check."""
    return len(data.translate(None, _C0_BYTES)) != len(data) or _C1_BYTES.search(data) is not None
