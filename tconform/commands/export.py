"""`tconform export`: write DIR/<case>/model.onnx for every component and the whole model."""

from __future__ import annotations

import time
from pathlib import Path

import click

from tconform import registry
from tconform.config import DEFAULT_PRESET, PRESETS, get_preset
from tconform.export import DEFAULT_OPSET, DTYPES, EXPORTERS, ExportSettings, export_cases
from tconform.weights import DEFAULT_SEED


@click.command("export")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Output folder [artifacts; artifacts-fp16 for --dtype float16].",
)
@click.option(
    "--preset",
    default=DEFAULT_PRESET,
    show_default=True,
    help=f"Model preset: {', '.join(PRESETS)}.",
)
@click.option("--case", "cases", multiple=True, help="Only this case (repeatable).")
@click.option("--exporter", type=click.Choice(EXPORTERS), default="dynamo", show_default=True)
@click.option("--opset", type=int, default=DEFAULT_OPSET, show_default=True)
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="float32", show_default=True)
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True)
@click.option("--jobs", type=int, default=None, help="Export processes [one per core, max 2].")
@click.option(
    "--force",
    is_flag=True,
    help="Replace model files tconform did not write or that changed since (never otherwise).",
)
def export(out, preset, cases, exporter, opset, dtype, seed, jobs, force) -> None:
    """Export every case (or --case) to ONNX, reusing cached models that are still current.

    Only tconform's own unchanged files are replaced; a folder holds models of one exporter,
    opset and dtype (float16 goes to artifacts-fp16 by default)."""
    cfg = get_preset(preset)
    out = out or Path("artifacts" if dtype == "float32" else "artifacts-fp16")
    selected = registry.select_cases(cases)
    settings = ExportSettings(cfg, seed, exporter, opset, dtype)
    started = time.perf_counter()
    done = 0

    def report(record) -> None:
        nonlocal done
        done += 1
        how = "cached, reused" if record.cached else "exported"
        click.echo(f"[{done}/{len(selected)}] {record.case:20s} {how:15s} {out / record.path}")

    records = export_cases(selected, settings, out, on_done=report, force=force, jobs=jobs)
    fresh = sum(not r.cached for r in records)
    click.echo(
        f"{len(records)} models in {out} ({fresh} exported, {len(records) - fresh} cached) "
        f"with {exporter}, opset {opset}, {dtype}, in {time.perf_counter() - started:.1f}s"
    )
