"""The option types every command shares (tconform.commands.options)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tconform.commands.options import axes_options

pytestmark = pytest.mark.unit


@click.command()
@axes_options("{}", exporters="auto", opsets="18", dtypes="float32", graph_opts="all")
def shows_axes(axes) -> None:
    click.echo(repr((axes.matrix, dict(axes.given))))


@pytest.mark.parametrize(
    ("args", "given"),
    [
        (["--dtype", "float16,float32"], {"dtypes": ("float16", "float32")}),
        # repeated, an axis holds every value given: the last alone dropped the others
        (["--dtype", "float16", "--dtype", "float32"], {"dtypes": ("float16", "float32")}),
        (["--opset", "18", "--opset", "20,21"], {"opsets": (18, 20, 21)}),
        ([], {}),
    ],
)
def test_an_axis_holds_every_value_given_comma_listed_or_repeated(args, given):
    result = CliRunner().invoke(shows_axes, ["--matrix", *args])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == repr((True, given))


def test_a_value_given_twice_across_repeats_is_refused():
    result = CliRunner().invoke(shows_axes, ["--dtype", "float16", "--dtype", "float16"])
    assert result.exit_code == 2
    assert "--dtype: 'float16' given twice" in result.output
