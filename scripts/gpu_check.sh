#!/usr/bin/env bash
# Run tconform's CUDA conformance matrix on a machine with an NVIDIA GPU.
#
#   scripts/gpu_check.sh WHEEL_DIR [OUT_DIR] [-- extra gpu_matrix.py options]
#
# WHEEL_DIR (or a .whl file itself) holds an onnxruntime-gpu cp312 wheel, whole (*.whl) or split into parts
# (NAME.whl.part-aa, NAME.whl.part-ab, ... or NAME.whl.000, NAME.whl.001, ...: any suffix after
# ".whl" that sorts in order), or the wheel packed by scripts/pack_ort_gpu.py (NAME.tar.xz, whole
# or in parts: its CUDA kernels pruned to one GPU architecture so that it fits a small transfer).
# The parts are joined; a wheel is installed with --no-deps into OUT_DIR/site, a packed one
# unpacked there; that folder is put first on PYTHONPATH (ahead of any CPU onnxruntime), and every
# tconform process calls onnxruntime.preload_dlls() so that the CUDA 13 / cuDNN 9 libraries of
# the installed PyTorch (its nvidia-* packages) are found. Then scripts/gpu_matrix.py runs the GPU
# matrix (strict float32, TF32, the reduced precisions, sdpa graphs, document checks, generation,
# `tconform check` on zoo models, the gpu-marked tests, the benches), writing reports, logs,
# environment.json and summary.md into OUT_DIR (default: gpu-run). The exit status is
# gpu_matrix.py's: the worst exit code of its steps.
#
# Environment: PYTHON (default python3) must be CPython 3.12 with tconform's dependencies
# (torch, onnx, onnxscript, numpy, click); nothing is downloaded.
set -euo pipefail

usage() { echo "usage: $0 WHEEL_DIR [OUT_DIR] [-- gpu_matrix.py options]" >&2; exit 2; }

[[ $# -ge 1 ]] || usage
wheel_dir=$1; shift
out_dir=gpu-run
if [[ $# -ge 1 && $1 != "--" ]]; then out_dir=$1; shift; fi
if [[ $# -ge 1 && $1 == "--" ]]; then shift; fi
[[ -d $wheel_dir || $wheel_dir == *.whl && -f $wheel_dir ]] ||
    { echo "gpu_check: $wheel_dir is neither a folder nor a .whl file" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)

# 1. The wheel: use a whole one, else join the parts in name order
# (version order, so that NAME.whl.part2 comes before NAME.whl.part10).
shopt -s nullglob
whole=("$wheel_dir"/onnxruntime_gpu-*cp312*.whl)
parts=("$wheel_dir"/onnxruntime_gpu-*cp312*.whl?*)
packed=("$wheel_dir"/onnxruntime_gpu-*cp312*.tar.xz*)
site="$out_dir/site"
if [[ -d $wheel_dir && ${#whole[@]} -eq 0 && ${#packed[@]} -ge 1 ]]; then
    mapfile -t sorted_packed < <(printf '%s\n' "${packed[@]}" | LC_ALL=C sort -V)
    rm -rf "$site" && mkdir -p "$site"
    cat "${sorted_packed[@]}" | xz -d -T0 | tar -x -C "$site" ||
        { echo "gpu_check: the packed wheel in $wheel_dir does not unpack (parts missing?)" >&2; exit 2; }
    echo "gpu_check: unpacked ${#sorted_packed[@]} part(s) into $site"
    wheel=""
elif [[ -f $wheel_dir ]]; then
    wheel=$wheel_dir
elif [[ ${#whole[@]} -ge 1 ]]; then
    wheel=${whole[0]}
elif [[ ${#parts[@]} -ge 1 ]]; then
    first=$(basename "${parts[0]}")
    wheel="$out_dir/${first%%.whl*}.whl"  # the name pip needs: everything up to ".whl"
    mapfile -t sorted_parts < <(printf '%s\n' "${parts[@]}" | LC_ALL=C sort -V)  # -V: part2 before part10
    cat "${sorted_parts[@]}" > "$wheel"
    echo "gpu_check: joined ${#sorted_parts[@]} parts into $wheel"
else
    echo "gpu_check: no onnxruntime_gpu-*cp312*.whl (or .whl parts, or a packed .tar.xz) in $wheel_dir" >&2
    exit 2
fi
if [[ -n $wheel ]]; then
    "$python" -c 'import sys, zipfile as z; p = sys.argv[1]; sys.exit(not z.is_zipfile(p) or z.ZipFile(p).testzip() is not None)' \
        "$wheel" || { echo "gpu_check: $wheel is not a valid wheel (parts missing?)" >&2; exit 2; }
fi

# 2. The wheel is built for CPython 3.12 only.
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    echo "gpu_check: $python is $("$python" -V 2>&1), the onnxruntime-gpu wheel needs 3.12" >&2
    exit 2
fi

# 3. Install it apart from the environment's packages (unpacked already if it came packed) and
# put it first on the path.
if [[ -n $wheel ]]; then
    "$python" -m pip install --quiet --no-deps --upgrade --target "$site" "$wheel"
fi
export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"

# 4. Show what ONNX Runtime sees before the matrix (the reason if CUDA cannot load).
"$python" - <<'EOF'
import torch  # first, so that torch's own cuDNN is loaded (see gpu_matrix.PRELOAD)
import onnxruntime
onnxruntime.preload_dlls()
from tconform.runtimes.providers import unavailable_reason
print("onnxruntime", onnxruntime.__version__, "from", onnxruntime.__file__)
print("providers offered:", onnxruntime.get_available_providers())
print("CUDA provider:", unavailable_reason("cuda") or "runs")
EOF

# 5. The matrix; gpu_matrix.py's exit status is the worst tconform exit code.
cd "$repo"
exec "$python" "$repo/scripts/gpu_matrix.py" --out "$out_dir" "$@"
