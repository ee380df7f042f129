"""Pack an onnxruntime-gpu wheel for a GPU machine that takes at most so many bytes per call.

    python scripts/pack_ort_gpu.py WHEEL OUT_DIR [--arch 90] [--part-mb 60]

The CUDA provider library of onnxruntime-gpu 1.31 (284 MB of its 350) is mostly a fat binary:
one machine-code (SASS) copy of every kernel per GPU architecture (sm_75, 80, 86, 89, 90, 120)
and no PTX. The CUDA driver loads only the copy of the GPU's own architecture, so the others can
be zeroed in place: the library keeps its size and layout (every ELF offset, every fat-binary
header), and the zeros compress to nothing. The wheel's contents are then written as one
xz-compressed tar (the x86 filter for the libraries' code), split into parts under `--part-mb`:
`NAME.tar.xz.part-aa`, `-ab`, ... `scripts/gpu_check.sh` joins them and unpacks the tar as the
site folder it puts on PYTHONPATH (what `pip install --target` would have written).

A library so pruned runs only on GPUs of `--arch` (90: H100, H200); anywhere else the driver
finds no kernel for the device and the CUDA provider fails to run, which tconform reports as
unavailable. Measured on onnxruntime-gpu 1.31.1: of the 255.6 MB wheel's library, 141.6 MB of SASS
zeroed; with the unused libraries left out, the packed tar is about 59 MB: one part, which
fits one call's 64 MiB beside the checkout.
"""

from __future__ import annotations

import argparse
import io
import lzma
import struct
import tarfile
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
CUDA_LIBRARY = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
# Libraries the Python binding never loads: the C API's own copy of the core (the binding,
# onnxruntime_pybind11_state, links the core statically) and the TensorRT provider.
UNUSED = (
    "onnxruntime/capi/libonnxruntime.so",
    "onnxruntime/capi/libonnxruntime_providers_tensorrt",
)


def sections(data: bytes | bytearray) -> dict[str, tuple[int, int]]:
    """An ELF64 little-endian file's section names -> (offset, size)."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * entsize) for i in range(count)]
    names_offset = headers[names_index][4]

    def name(at: int) -> str:
        start = names_offset + at
        return bytes(data[start : data.index(b"\0", start)]).decode()

    return {name(h[0]): (h[4], h[5]) for h in headers}


def zero_other_architectures(data: bytearray, arch: int) -> int:
    """Zero, in place, the payload of every fat-binary entry in `.nv_fatbin` whose SM
    architecture is not `arch`; headers stay. Returns the bytes zeroed."""
    offset, size = sections(data)[".nv_fatbin"]
    position, end, zeroed = offset, offset + size, 0
    while position < end:
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", data, position)
        if magic != FATBIN_MAGIC:  # fat binaries are 8-byte aligned, with padding between
            position += 8
            continue
        entry, fat_end = position + header_size, position + header_size + fat_size
        while entry < fat_end:
            _, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (entry_arch,) = struct.unpack_from("<I", data, entry + 28)
            if entry_arch != arch:
                start = entry + entry_header
                data[start : start + payload] = bytes(payload)
                zeroed += payload
            entry += entry_header + payload
        position = fat_end
    return zeroed


def pack(wheel: Path, out: Path, arch: int, part_mb: float) -> list[Path]:
    """`wheel`'s contents, pruned to `arch`, as xz-compressed tar parts in `out`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(wheel) as archive, tarfile.open(fileobj=buffer, mode="w") as tar:
        for item in archive.infolist():
            if item.is_dir() or item.filename.startswith(UNUSED):
                continue
            content = archive.read(item)
            if item.filename == CUDA_LIBRARY:
                library = bytearray(content)
                print(f"zeroed {zero_other_architectures(library, arch) / 1e6:.1f} MB of SASS")
                content = bytes(library)
            info = tarfile.TarInfo(item.filename)
            info.size = len(content)
            info.mode = 0o755 if item.filename.endswith(".so") or ".so." in item.filename else 0o644
            tar.addfile(info, io.BytesIO(content))
    filters = [
        {"id": lzma.FILTER_X86},
        {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME},
    ]
    packed = lzma.compress(buffer.getvalue(), format=lzma.FORMAT_XZ, filters=filters)
    out.mkdir(parents=True, exist_ok=True)
    name = wheel.name.removesuffix(".whl") + f".sm{arch}.tar.xz"
    step = int(part_mb * 1e6)
    parts = []
    for n, start in enumerate(range(0, len(packed), step)):
        part = out / f"{name}.part-{chr(97 + n // 26)}{chr(97 + n % 26)}"
        part.write_bytes(packed[start : start + step])
        parts.append(part)
    print(f"{wheel.name}: {len(packed) / 1e6:.1f} MB in {len(parts)} part(s) in {out}")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", type=int, default=90, help="SM architecture to keep [90]")
    parser.add_argument("--part-mb", type=float, default=60.0, help="largest part, MB [60]")
    options = parser.parse_args()
    pack(options.wheel, options.out, options.arch, options.part_mb)


if __name__ == "__main__":
    main()
