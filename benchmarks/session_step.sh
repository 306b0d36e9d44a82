# Sourced by the GPU session scripts (gpu_train_session.sh, gpu_embed_session.sh): one time-limited step.
# Needs $out (where summary.txt goes), $logs (per-step logs) and $deadline (in $SECONDS) set first.
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
