"""The options runtimes declare (Runtime.options): each defined once, in its runtime's module,
offered by every command that takes runtimes and by the Python API."""

from __future__ import annotations

import dataclasses

import click
import pytest

from tconform.cli import cli
from tconform.commands.options import RuntimeCommand
from tconform.errors import UsageError
from tconform.runtimes import (
    RUNTIMES,
    RuntimeOptions,
    declared_options,
    declared_settings,
    make_runtimes,
    runtime_class,
)

pytestmark = pytest.mark.unit


def test_every_declared_option_is_a_field_of_its_runtime():
    for name in RUNTIMES:
        cls = runtime_class(name)
        fields = {f.name for f in dataclasses.fields(cls)}
        assert {o.field for o in cls.options} <= fields, name
    assert {"tf32", "graph_opt", "bf16", "device_id", "provider_options"} <= set(declared_options())


def test_every_command_that_takes_runtimes_offers_every_declared_option():
    takes_runtimes = [
        c for c in cli.commands.values() if any(p.name == "ep_spec" for p in c.params)
    ]
    assert {c.name for c in takes_runtimes} == {"verify", "check", "doc", "bench"}
    for command in takes_runtimes:
        assert isinstance(command, RuntimeCommand), command.name
        offered = {p.name for p in command.get_params(click.Context(command))}
        assert set(declared_options()) <= offered, command.name


def test_a_setting_reaches_only_the_runtimes_that_take_it():
    options = RuntimeOptions(
        ("onnxruntime", "torch"), settings={"graph_opt": "basic", "provider_options": {"a": "b"}}
    )
    ort, torch = make_runtimes(options)
    assert ort.graph_opt == "basic" and ort.provider_options == {"a": "b"}
    assert not hasattr(torch, "graph_opt")


def test_the_api_refuses_an_option_no_runtime_declares():
    assert declared_settings({"tf32": True}) == {"tf32": True}
    with pytest.raises(UsageError, match=r"'tf_32': no runtime takes it.*tf32"):
        declared_settings({"tf_32": True})
