# Sourced by the GPU session scripts (gpu_train_session.sh, gpu_embed_session.sh): the session's
# folders and limits, the carried packages, and one time-limited step.

session_begin() {  # session_begin NAME BUDGET_S OUTDIR: sets $out (where summary.txt goes), $py,
    # $device, $deadline (in $SECONDS: BUDGET overrides BUDGET_S), $work (removed by the script at
    # its end) and $logs (per-step logs)
    out=${3:?usage: gpu_$1_session.sh OUTDIR}
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1
    py=${PYTHON:-python3}
    device=${DEVICE:-cuda}
    deadline=$((SECONDS + ${BUDGET:-$2}))  # every step ends by then, whatever its own limit
    work=$(mktemp -d "/tmp/elmo-gpu-$1-XXXXXX")
    logs=$work/logs
    mkdir -p "$logs"
}

use_site() {  # SITE=.whl/site.tar.xz (infra/gpu_site.sh, carried in): its packages unpacked onto PYTHONPATH
    [ -n "${SITE:-}" ] || return 0
    local started=$SECONDS
    $py -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
        "$SITE" "$work/site" || { echo "=== could not unpack $SITE" >&2; exit 1; }
    export PYTHONPATH=$work/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
    echo "=== $SITE unpacked in $((SECONDS - started)) s"
}
step() {  # step NAME SECONDS CMD...: run with a limit, log to logs/NAME.txt, never stop the session
    local name=$1 limit=$2; shift 2
    local left=$((deadline - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then echo "=== $name skipped: out of time" | tee -a "$out/summary.txt"; return; fi
    echo "=== $name ($(date +%T), limit ${limit}s): $*"
    timeout "$limit" "$@" >"$logs/$name.txt" 2>"$logs/$name.err"
    local rc=$?
    echo "=== $name exit $rc ($(date +%T))"
    tail -n 30 "$logs/$name.txt"
    tail -n 5 "$logs/$name.err"
    { echo "== $name (exit $rc)"; cat "$logs/$name.txt"; tail -n 5 "$logs/$name.err"; } >>"$out/summary.txt"
}
