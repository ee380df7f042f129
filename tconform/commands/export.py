"""`tconform export`: write DIR/<case>/model.onnx for every component and the whole model."""

from __future__ import annotations

import time
from pathlib import Path

import click

from tconform.commands.options import (
    FolderPath,
    WholeNumber,
    attention_option,
    case_option,
    preset_option,
    seed_option,
)
from tconform.config import MODEL_DTYPES


@click.command("export")
@click.option(
    "--out",
    type=FolderPath(),
    default=None,
    help="Output folder [artifacts; artifacts-fp16, artifacts-bfloat16, artifacts-int8, "
    "artifacts-int4].",
)
@preset_option()
@case_option()
@click.option(
    "--exporter", type=click.Choice(["dynamo", "torchscript"]), default="dynamo", show_default=True
)
@click.option(
    "--opset",
    type=WholeNumber(17, 23),
    default=None,
    help="ONNX opset (17..23 for dynamo, 17..20 for torchscript) [18; 23 with --attention sdpa].",
)
@click.option(
    "--dtype",
    type=click.Choice(MODEL_DTYPES),
    default="float32",
    show_default=True,
)
@attention_option("[plain]")
@seed_option()
@click.option(
    "--jobs", type=WholeNumber(1, 64), default=None, help="Export processes [cores, max 2]."
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace model files tconform did not write or that changed since (never otherwise).",
)
def export(out, preset, cases, exporter, opset, dtype, attention, seed, jobs, force) -> None:
    """Export every case (or --case) to ONNX, reusing cached models that are still current.

    Only tconform's own unchanged files are replaced; a folder holds models of one exporter,
    opset, dtype and attention kernel (float16 goes to artifacts-fp16 by default)."""
    from tconform import registry
    from tconform.config import get_preset
    from tconform.export import ExportSettings, default_opset, export_cases

    cfg = get_preset(preset)
    out = out or Path(
        {"float32": "artifacts", "float16": "artifacts-fp16"}.get(dtype, f"artifacts-{dtype}")
    )
    selected = registry.select_cases(cases)
    attention = attention or "plain"
    opset = opset or default_opset(attention)
    settings = ExportSettings(cfg, seed, exporter, opset, dtype, attention)
    started = time.perf_counter()
    with click.progressbar(
        length=len(selected), label=f"exporting to {out}", file=click.get_text_stream("stderr")
    ) as bar:
        records = []

        def report(record) -> None:
            records.append(record)
            how = "cached, reused" if record.cached else "exported"
            bar.update(1)
            click.echo(f"  {record.case:20s} {how:15s} {out / record.path}", err=True)

        export_cases(selected, settings, out, on_done=report, force=force, jobs=jobs)
    fresh = sum(not r.cached for r in records)
    click.echo(
        f"{len(records)} models in {out} ({fresh} exported, {len(records) - fresh} cached) "
        f"with {exporter}, opset {opset}, {dtype}, {attention} attention, "
        f"in {time.perf_counter() - started:.1f}s"
    )
