"""ShardError: the one exception the shard stage raises for bad input, config or output."""

from __future__ import annotations

from pipeline.errors import PipelineError


class ShardError(PipelineError):
    """A shard run that cannot proceed; the message is one line naming the path or key and the cause."""


class ReservedWordError(ShardError):
    """A corpus line holds a word the stage reserves (``<S>``, ``</S>``, ``<UNK>`` or KenLM's
    ``<s>``, ``</s>``, ``<unk>``): raised by the counting pass, which knows the chunk, not its file;
    the driver names the file (`in_file`)."""

    def __init__(self, word: str, line: str, source: int = -1, path: str = ""):
        self.word, self.line, self.source, self.path = word, line, source, path
        shown = line if len(line) <= 80 else line[:77] + "..."
        where = f"{path}: " if path else ""
        super().__init__(
            f"{where}the line {shown!r} holds {word!r}, a word the shard stage reserves (it adds <S> and "
            "</S> to every sentence itself, and writes <UNK> for words outside the vocabulary; KenLM "
            "spells them <s>, </s>, <unk>): remove or rewrite them in the corpus and run again"
        )

    def __reduce__(self):  # from a Ray task to the driver, with its fields
        return (ReservedWordError, (self.word, self.line, self.source, self.path))

    def in_file(self, path: str) -> ReservedWordError:
        return ReservedWordError(self.word, self.line, self.source, path)
