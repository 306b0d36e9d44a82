#!/usr/bin/env bash
# The Python packages a GPU session carries, as one trimmed site-packages archive (under 60 MB).
#
#   bash infra/gpu_site.sh            # writes .whl/site.tar.xz (ignored by git through .git/info/exclude)
#
# The lent GPU machines reach no registry. Their image has Python 3.12 with torch, numpy, h5py,
# pyarrow, pandas, matplotlib, tqdm, pyyaml, requests, grpcio, protobuf, aiohttp, psutil and msgpack,
# but not Ray, webdataset, omegaconf, boto3, sacremoses or wandb. This script downloads those (the
# versions this checkout's .venv runs, for CPython 3.12 on x86-64 Linux) from PyPI, unpacks them,
# leaves out what no stage imports (Ray's RLlib, Serve, LLM, Java jars and dashboard client;
# botocore's data for services other than S3 and STS; wandb's system monitor and Parquet library;
# tests), strips the binaries and packs the rest with xz: 31 MB against gzip's 54, which leaves a
# call's 64 MiB carry room for a corpus (benchmarks/gpu_train_session.sh). A GPU call carries it and
# names it; the session scripts unpack it with Python (the image need not have xz). Not carried:
# blingfire (99 MB of models) and zstandard, which only record corpora load (the GPU scripts read text).
#
#   run(carry=[".whl"], command='SITE=.whl/site.tar.xz bash benchmarks/gpu_embed_session.sh $OUT')
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
[ -x "$venv/bin/pip" ] || { echo "no $venv: run 'make setup' first (its versions are the ones carried)" >&2; exit 1; }
# The packages the stages import that the GPU image lacks, with what they need in turn (markers
# evaluated for CPython 3.12 on Linux), at the versions installed in $venv. IMAGE: the image's
# packages as the device tool's KINDS.md listed them (read 2026-11-17).
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cloudpickle colorama contourpy cycler filelock fonttools frozenlist fsspec grpcio h11
h5py httpcore httpx idna jinja2 joblib kiwisolver markupsafe matplotlib msgpack multidict numpy packaging
pandas pillow pip prometheus-client propcache protobuf psutil pyarrow pyparsing python-dateutil pyyaml regex
requests rich setuptools six tqdm torch triton typing-extensions typing-inspect urllib3 wheel xxhash yarl zipp"
mapfile -t pins < <(IMAGE="$IMAGE" "$venv/bin/python" - <<'PY'
import os
import re
from importlib import metadata

from packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

image = {norm(n) for n in os.environ["IMAGE"].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix"}
todo = [("ray", {"data", "train"}), ("webdataset", set()), ("omegaconf", set()), ("boto3", set()),
        ("sacremoses", set()), ("wandb", set())]
pins = {}
while todo:
    name, extras = todo.pop()
    if norm(name) in image or norm(name) in pins:
        continue
    dist = metadata.distribution(name)
    pins[norm(name)] = dist.version
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras or {""}):
            todo.append((req.name, set(req.extras)))
for name, version in sorted(pins.items()):
    print(f"{name}=={version}")
PY
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
"$venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$tmp/wheels" "${pins[@]}"
"$venv/bin/pip" install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" --target "$tmp/site" "$tmp"/wheels/*.whl
site=$tmp/site
# wandb: the system monitor (runs set x_disable_stats) and the Parquet library (tables) are not used
rm -rf "$site"/ray/rllib "$site"/ray/serve "$site"/ray/llm "$site"/ray/jars "$site"/ray/dashboard/client \
       "$site"/bin "$site"/*/tests "$site"/ray/*/tests "$site"/wandb/bin/wandb-symon \
       "$site"/wandb/bin/librust_parquet_ffi.so
find "$site" -name __pycache__ -prune -exec rm -rf {} +
keep='^(s3|sts|endpoints.json|partitions.json|_retry.json|sdk-default-configuration.json)$'
for entry in "$site"/botocore/data/*; do
    basename "$entry" | grep -Eq "$keep" || rm -rf "$entry"
done
find "$site"/ray "$site"/wandb/bin -type f \( -name '*.so' -o -perm -u+x \) -exec strip --strip-unneeded {} + 2>/dev/null || true
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -f .whl/site.tgz  # the gzip archive of earlier versions
tar cf - -C "$site" . | xz -9 -T0 >.whl/site.tar.xz
size=$(du -m .whl/site.tar.xz | cut -f1)
echo ".whl/site.tar.xz: ${size} MB, ${#pins[@]} packages for CPython 3.12 (${pins[*]})"
[ "$size" -lt 60 ] || { echo "over 60 MB: trim more before a GPU call carries it" >&2; exit 1; }
