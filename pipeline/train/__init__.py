"""Stage 2: biLM pretraining on Ray Train (docs/training.md).

``data`` turns shard directories into the row-stream batches of the original recipe,
``char_cache`` holds the per-vocabulary character arrays those batches are built from, and
``unigram`` computes the held-out unigram perplexity logged beside the LM's as a baseline.
"""
