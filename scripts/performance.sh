#!/usr/bin/env bash
# Re-measure docs/performance.md in one command: the machine (lscpu, load), `tconform bench` on
# the whole model at 1x32 and 8x128 with 2 threads (both ONNX Runtime graph variants and torch
# eager, 4 s per measurement) and ONNX Runtime's per-op profile (JSON,
# markdown, plot), the plain-onnxruntime cross-check of the best variants' p50s, and the time of
# the model's matrix products alone (scripts/matmul_bound.py), and what the bench's session
# settings change in the outputs (scripts/settings_outputs.py).
# Usage: scripts/performance.sh [OUT_DIR]   (default results/performance)
set -euo pipefail
# bench exits 1 where a row's outputs left their tolerance row; its figures are written all the
# same, and that verdict is part of what this records, so the run goes on
failed() { echo "a bench exited $1: a row outside its tolerance (its verdict column)" >>"$out/machine.txt"; }

out=${1:-results/performance}
mkdir -p "$out"
{
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|Flags)'
    echo "load before: $(uptime)"
} >"$out/machine.txt"
tconform bench --case transformer --shape 1x32 --shape 8x128 --threads 2 --ep cpu --profile \
    --engine onnxruntime --engine onnxruntime-sdpa --engine torch --seconds 4 \
    --json "$out/bench-transformer.json" --markdown "$out/bench-transformer.md" \
    --plot "$out/bench-transformer.png" | tee "$out/bench-transformer.txt" || failed $?
python scripts/plain_timing.py "$out/bench-transformer.json" \
    --json "$out/plain-timing.json" | tee "$out/plain-timing.txt"
python scripts/matmul_bound.py "$out/bench-transformer.json" \
    --json "$out/matmul-bound.json" | tee "$out/matmul-bound.txt"
python scripts/settings_outputs.py "$out/bench-transformer.json" \
    --json "$out/settings-outputs.json" | tee "$out/settings-outputs.txt"
echo "load after: $(uptime)" >>"$out/machine.txt"
