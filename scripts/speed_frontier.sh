#!/usr/bin/env bash
# The verified speed frontier (docs/performance.md, "The verified speed frontier"), in one
# command on a quiet machine: the CPU (model, instruction sets, load), `tconform bench` on the
# whole base model at 1x32 and 8x128 with every engine of the frontier (ceilings per precision
# measured in the same run, each row judged under its own precision's row), and `tconform bench
# --generate` (per-token decoding at batch 1 with the cache) with every decoding engine.
#
# On a CPU without native bfloat16 (no AVX512-BF16, no AMX) torch's bfloat16 products run in a
# scalar fallback (well under 1 GFLOP/s, docs/performance.md): the torch bf16 engines are then
# timed at 1x32 only (one 8x128 run would take minutes) and left out of decoding, and the script
# says so in machine.txt. openvino-bf16 reports itself not available there.
#
# Usage: scripts/speed_frontier.sh [OUT_DIR]   (default results/speed-frontier)
set -euo pipefail
# bench exits 1 where a row's outputs left their tolerance row; its figures are written all the
# same, and that verdict is part of what this records, so the run goes on
failed() { echo "a bench exited $1: a row outside its tolerance (its verdict column)" >>"$out/machine.txt"; }

out=${1:-results/speed-frontier}
mkdir -p "$out"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
native_bf16=no
if [[ $flags == *avx512_bf16* || $flags == *amx_bf16* ]]; then native_bf16=yes; fi
{
    lscpu | grep -E '^(Model name|CPU family|Model:|CPU\(s\)|Thread|Core|Socket)'
    echo "instruction sets:" $(tr ' ' '\n' <<<"$flags" |
        grep -E '^(avx2|fma|avx512f|avx512_vnni|avx_vnni|avx512_bf16|amx_tile|amx_bf16|amx_int8)$')
    echo "native bfloat16 (AVX512-BF16 or AMX): $native_bf16"
    echo "load before: $(uptime)"
} >"$out/machine.txt"

common=(--preset base --case transformer --threads 2 --ep cpu --seconds 3)
engines=(--engine onnxruntime --engine onnxruntime-sdpa --engine onnxruntime-int8
    --engine onnxruntime-sdpa-int8 --engine onnxruntime-int4 --engine openvino-bf16
    --engine torch --engine torch-compile --engine torch-int8 --engine torch-compile-int8)
bf16=(--engine torch-bf16 --engine torch-compile-bf16)
if [[ $native_bf16 == yes ]]; then
    engines+=("${bf16[@]}")
else
    echo "torch bf16 engines: 1x32 only, in bench-torch-bf16-1x32.* (no native bfloat16)" \
        >>"$out/machine.txt"
    tconform bench "${common[@]}" --shape 1x32 "${bf16[@]}" --engine torch --warmup 1 \
        --json "$out/bench-torch-bf16-1x32.json" | tee "$out/bench-torch-bf16-1x32.txt" || failed $?
fi
tconform bench "${common[@]}" --shape 1x32 --shape 8x128 "${engines[@]}" --profile \
    --json "$out/bench.json" --markdown "$out/bench.md" --plot "$out/bench.png" |
    tee "$out/bench.txt" || failed $?

decoders=(--engine onnxruntime --engine onnxruntime-int8 --engine onnxruntime-int4
    --engine openvino --engine openvino-bf16 --engine torch --engine torch-int8)
if [[ $native_bf16 == yes ]]; then decoders+=(--engine torch-bf16); fi
tconform bench --preset base --ep cpu --threads 2 --generate 32 "${decoders[@]}" \
    --json "$out/generate.json" --markdown "$out/generate.md" --plot "$out/generate.png" |
    tee "$out/generate.txt" || failed $?
echo "load after: $(uptime)" >>"$out/machine.txt"
