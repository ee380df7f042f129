"""`tconform golden`: write goldens from the float64 oracle, or check them for drift."""

from __future__ import annotations

from pathlib import Path

import click

from tconform import golden as golden_stage
from tconform import registry
from tconform.config import DEFAULT_PRESET, PRESETS, get_preset
from tconform.errors import EXIT_FAILURE
from tconform.weights import DEFAULT_SEED


@click.command("golden")
@click.option("--out", type=click.Path(path_type=Path), default=Path("golden"), show_default=True)
@click.option(
    "--preset",
    default=DEFAULT_PRESET,
    show_default=True,
    help=f"Model preset: {', '.join(PRESETS)}.",
)
@click.option("--case", "cases", multiple=True, help="Only this case (repeatable).")
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True)
@click.option(
    "--force", is_flag=True, help="Replace an existing golden folder (never any other folder)."
)
@click.option(
    "--check",
    is_flag=True,
    help="Regenerate in memory and compare with the folder (its cases, sets and values; "
    "--case limits the cases expected); exit 1 on drift.",
)
def golden(out, preset, cases, seed, force, check) -> None:
    """Write golden/<case>/test_data_set_N/{input,output}_K.pb and golden/manifest.json."""
    if check:
        drifts, one_ulp = golden_stage.check(out, registry.select_cases(cases) if cases else None)
        for drift in drifts:
            click.echo(f"drift: {drift.path}: {drift.message}")
        note = f" ({one_ulp} output elements differ by one float32 ulp: summation order)"
        click.echo(
            f"{out}: {'DRIFT' if drifts else 'matches a regeneration'}{note if one_ulp else ''}"
        )
        if drifts:
            raise SystemExit(EXIT_FAILURE)
        return
    selected = registry.select_cases(cases)
    manifest = golden_stage.write(
        out,
        get_preset(preset),
        seed,
        selected,
        preset,
        force,
        on_case=lambda c: click.echo(f"  {c.name}", err=True),
    )
    n_sets = len(manifest["input_sets"])
    click.echo(f"wrote goldens for {len(selected)} cases x {n_sets} input sets to {out}")
