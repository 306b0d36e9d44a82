"""ShardError: the one exception the shard stage raises for bad input, config or output."""

from pipeline.errors import PipelineError


class ShardError(PipelineError):
    """A shard run that cannot proceed; the message is one line naming the path or key and the cause."""
