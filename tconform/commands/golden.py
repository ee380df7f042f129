"""`tconform golden`: write goldens from the float64 oracle, or check them for drift."""

from __future__ import annotations

from pathlib import Path

import click

from tconform.commands.options import FolderPath, case_option, preset_option, seed_option
from tconform.errors import EXIT_FAILURE


@click.command("golden")
@click.option(
    "--out",
    type=FolderPath(),
    default=Path("golden"),
    show_default=True,
)
@preset_option()
@case_option()
@seed_option()
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing golden folder, or with --case only the named cases in it (never "
    "any other folder).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Regenerate in memory and compare with the folder (its cases, sets and values; "
    "with --case, those cases alone); exit 1 on drift.",
)
@click.option(
    "--generation",
    is_flag=True,
    help="The generation goldens instead (sequences decoded with the trained checkpoint 'reverse', "
    "tiny preset; --out defaults to golden-generation).",
)
@click.pass_context
def golden(ctx, out, preset, cases, seed, force, check, generation) -> None:
    """Write golden/<case>/test_data_set_N/{input,output}_K.pb and golden/manifest.json."""
    # What an option would change but for these: refused, never silently passed over
    if check:
        _refuse_given(ctx, ("seed", "preset", "force"), "--check regenerates as the folder says")
    if generation:
        _refuse_given(ctx, ("cases",), "--generation writes every generation case")
    if generation:
        from tconform.generation.golden import run_golden_command

        if ctx.get_parameter_source("out") == click.core.ParameterSource.DEFAULT:
            out = Path("golden-generation")
        run_golden_command(out, preset, seed, force, check)
        return
    from tconform import golden as golden_stage
    from tconform import registry
    from tconform.config import get_preset

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
        only_these=bool(cases),
    )
    n_sets = len(manifest["input_sets"])
    click.echo(f"wrote goldens for {len(selected)} cases x {n_sets} input sets to {out}")


def _refuse_given(ctx: click.Context, names: tuple[str, ...], why: str) -> None:
    """A usage error naming the first of `names` given on the command line."""
    for param in ctx.command.params:
        if param.name in names and ctx.get_parameter_source(param.name) not in (
            click.core.ParameterSource.DEFAULT,
            None,
        ):
            raise click.UsageError(f"{param.opts[0]}: not taken here ({why})")
