#!/usr/bin/env bash
# Time the default `tconform verify` suite cold (empty artifact folder: every model exported)
# and then warm (export cache reused). Targets (docs/performance.md): cold <= 60 s, warm <= 15 s.
# Usage: scripts/time_verify.sh [ARTIFACT_DIR]   (default /tmp/vcold; it is deleted first)
set -euo pipefail

artifacts="${1:-/tmp/vcold}"
echo "load before: $(uptime)"
rm -rf -- "$artifacts"

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
