"""`tconform check` on a large input: the process's peak memory, per phase, in multiples of the
input's size (docs/check.md, "Large inputs").

    python scripts/check_memory.py [--mb 320] [--localise] [--json FILE]

The module is small (Linear 64x64, GELU, LayerNorm, Linear 64x64); its input is a float32
(N, 64) tensor of about MB megabytes, and its output as large. Each measurement runs in a fresh
process: import, build the module and its input, then `tconform.check(module, inputs)` (the
CLI runs the same in its child process) with ONNX Runtime and PyTorch, the high-water mark
(VmHWM) read and reset at each phase. The peak is the process's whole resident size (libraries
and the input included), not a rise above a baseline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIDTH = 64


def build(mb: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)
    ).eval()
    rows = mb * 2**20 // (4 * WIDTH)
    return module, (torch.randn(rows, WIDTH),)


def measure(mb: int, localise: bool) -> dict:
    """In this process: check (and localise, when asked) the module on its large input."""
    import tconform
    from tconform.bench.timing import peak_rss_mb, reset_peak_rss

    module, inputs = build(mb)
    input_mb = inputs[0].numel() * 4 / 2**20
    phases: list[list] = []
    current = ["building the module and its input"]
    started = time.perf_counter()

    def close_phase() -> None:
        phases.append([current[0], round(peak_rss_mb())])
        reset_peak_rss()

    with tempfile.TemporaryDirectory() as tmp:

        def progress(line: str) -> None:
            close_phase()
            current[0] = line.split(": ", 1)[-1].replace(tmp, "TMP")  # no machine's path kept

        report = tconform.check(
            module, inputs, out_dir=Path(tmp) / "export", localise=localise or None,
            progress=progress,
        )  # fmt: skip
        close_phase()
    peak = max(mb for _, mb in phases)
    return {
        "input_mb": round(input_mb),
        "localise": localise,
        "peak_rss_mb": peak,
        "peak_over_input": round(peak / input_mb, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "exit_code": report.exit_code,
        "phases": phases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=320, help="the input's size in MiB")
    parser.add_argument("--localise", action="store_true", help="also localise (on a pass)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.mb, args.localise)))
        return
    command = [sys.executable, __file__, "--measure", "--mb", str(args.mb)]
    child = subprocess.run(
        command + (["--localise"] if args.localise else []),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    row = json.loads(child.stdout.strip().splitlines()[-1])
    for phase, mb in row["phases"]:
        print(f"{mb:8d} MB  {phase}")
    print(
        f"input {row['input_mb']} MB; peak {row['peak_rss_mb']} MB ({row['peak_over_input']}x "
        f"the input); {row['seconds']} s; exit {row['exit_code']}"
    )
    if args.json:
        args.json.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
