"""The command line the scripts that read a `tconform bench` JSON report share."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_bench_report(description: str, runs: int) -> tuple[argparse.Namespace, dict]:
    """(arguments, report) for `SCRIPT BENCH.json [--runs N] [--json OUT.json]`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("bench", type=Path, help="a tconform bench JSON report")
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    return args, json.loads(args.bench.read_text())


def best_cpu_rows(report: dict) -> list[tuple[dict, dict]]:
    """(best entry, its timing row) for each case and shape the report timed on the CPU."""
    return [
        (best, row)
        for best in report["best"]
        if best["ep"] == "cpu"
        for row in report["results"]
        if (row["case"], row["batch"], row["seq"], row["ep"], row["engine"])
        == (best["case"], best["batch"], best["seq"], "cpu", best["best_engine"])
    ]
