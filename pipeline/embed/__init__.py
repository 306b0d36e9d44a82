"""Stage 3: bulk embedding of a corpus with a biLM (see pipeline/embed/runner.py)."""
