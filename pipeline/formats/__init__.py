"""The data contracts between stages and what they are measured by: the shard directory format
and its typed manifest (written by shard, read by train and embed), the held-out baselines (unigram, Kneser-Ney), and how
raw input bytes are read (compression, control characters, record corpora: Parquet and JSON Lines
documents, the sentences a document splits into, and the words a sentence splits into)."""
