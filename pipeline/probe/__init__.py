"""Stage 4: what a model's layers know (``elmo probe`` / ``python -m jobs.probe``; docs/outputs.md#probe-report-elmo-probe).

- ``config``: ProbeConfig; ``runner``: a model (and its random control) from a config to a report;
  ``stage``: the stage's dashboard and closing lines;
- ``probe_set``: the shipped Brown part-of-speech sentences and WordNet sense examples;
- ``features``: every layer's vector of every token; ``pos_probe``: a linear classifier per layer
  (or a learned mix); ``wsd_probe``: the nearest sense centroid per layer;
- ``report``: the console table, ``probe.json`` and ``probe.png``;
- ``live``: the bounded probe a training run logs as it goes (rank 0).
"""
