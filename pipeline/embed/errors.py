"""The embed stage's one error type."""

from __future__ import annotations

from pipeline.errors import PipelineError
from pipeline.formats.shard_format import FormatError
from pipeline.runtime.storage import StorageError


class EmbedError(PipelineError):
    """A bad input, model, output or setting; the message is one line naming the path/key and the problem."""


WORKER_ERRORS = (EmbedError, StorageError, FormatError)
"""Errors with a one-line message that Ray workers report back as data: Ray Data would otherwise
wrap them in a UserCodeException whose text is a multi-line remote traceback."""
