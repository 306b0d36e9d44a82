#!/usr/bin/env bash
# Run a local SeaweedFS S3 server in the foreground (Ctrl-C stops it); prints the export lines
# that point the pipeline at it. Usage: infra/local-s3.sh --data-dir DIR [--port P] [--bucket NAME]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
cd "$root"
exec "$python" -m pipeline.tools.local_s3 "$@"
