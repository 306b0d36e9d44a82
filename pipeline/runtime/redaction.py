"""Credentials written into URLs (``http://user:secret@host``) kept out of everything people and
tools read: error messages, configs recorded in manifests, ``metrics.jsonl``, checkpoints and
wandb. The URL itself is still used as given (an S3 endpoint may need its userinfo); only what is
shown or stored is redacted.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "***"

_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")
"""``scheme://userinfo@``: the userinfo is everything up to the last ``@`` before the host."""


def redact(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)


def redact_values(value: Any) -> Any:
    """``value`` (plain containers, as a config's ``to_dict``) with every string redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_values(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_values(item) for item in value)
    return value
