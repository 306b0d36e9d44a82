"""Floor 1, the runtime every stage runs on: Ray (the embedded default or a cluster, its watchdog and
capacity), storage (local and ``s3://``, the only module that touches boto3), work off the caller's
path, credentials kept out of what is shown, the torch threads a CPU process takes on a shared
machine (``cpu_threads``), how a process is asked to stop (``stopping``: every signal handler), and how a helper process is
started and spoken to (``child_process``)."""
