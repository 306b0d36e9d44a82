# Sourced by the GPU session scripts (gpu_train_session.sh, gpu_embed_session.sh): the carried
# packages, and one time-limited step. Needs $py, $work (removed by the script at its end), $out (where
# summary.txt goes), $logs (per-step logs) and $deadline (in $SECONDS) set first.

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
