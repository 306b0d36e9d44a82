"""Developer tools shipped with the package, which no stage imports: a local S3 server for tests and
trying ``s3://`` paths (``python -m pipeline.tools.local_s3``), and the probe set's builder
(``python -m pipeline.tools.build_probe_set``)."""
