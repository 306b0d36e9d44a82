"""Thin entry points: the ``elmo`` CLI and one ``python -m jobs.<stage>`` module per Ray job."""
