#!/usr/bin/env bash
# Time the default `tconform verify` suite cold (empty artifact folder: every model exported)
# and then warm (export cache reused). Targets (docs/performance.md): cold <= 60 s, warm <= 15 s.
# Usage: scripts/time_verify.sh [ARTIFACT_DIR]   (a new folder: it must not exist yet;
# default: a fresh temporary folder, removed at the end)
set -euo pipefail

if [[ $# -ge 1 ]]; then
    artifacts=$1
    [[ ! -e $artifacts ]] || { echo "time_verify: $artifacts exists; name a new folder" >&2; exit 2; }
else
    artifacts=$(mktemp -d)/artifacts
    trap 'rm -rf -- "$(dirname "$artifacts")"' EXIT
fi
echo "load before: $(uptime)"

measure() {  # label: run verify once, print its wall time and exit status
    local label="$1" start end status=0
    start=$(date +%s.%N)
    tconform verify --artifacts "$artifacts" >/dev/null 2>&1 || status=$?
    end=$(date +%s.%N)
    printf '%s: %.1f s (exit %d)\n' "$label" "$(echo "$end - $start" | bc)" "$status"
}

measure cold
measure warm
echo "load after: $(uptime)"
