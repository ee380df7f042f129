"""The options runtimes declare (Runtime.options): each defined once, in its runtime's module,
offered by every command that takes runtimes and by the Python API."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest

from tconform.cli import cli
from tconform.commands.options import RuntimeCommand, runtime_options
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
        ("onnxruntime", "torch"), settings={"graph_opt": "basic", "spinning": False}
    )
    ort, torch = make_runtimes(options)
    assert ort.graph_opt == "basic" and ort.spinning is False
    assert not hasattr(torch, "graph_opt") and not hasattr(torch, "spinning")


def test_the_options_a_report_records_give_the_same_runtime_options_again():
    """A report's `runtime options:` line (RuntimeOptions.flags) is the command line that
    asked for them: parsed again, it sets every option as it was."""
    seen = []

    @click.command(cls=RuntimeCommand)
    @runtime_options("runtime", "ep", "threads", ep="cuda")  # --tf32 acts on CUDA alone
    def probe(runtime):
        seen.append(runtime.options())

    given = ["--threads", "2", "--graph-opt", "basic", "--no-spinning", "--tf32"]
    given += ["--provider-option", "a=b", "--provider-option", "c=d"]
    probe.main(given, standalone_mode=False)
    words = [w for flag in seen[0].flags() for w in flag.split(" ", 1)]
    assert sorted(words) == sorted(given)
    probe.main(words, standalone_mode=False)
    assert seen[1] == seen[0] and seen[0].settings["provider_options"] == {"a": "b", "c": "d"}


@pytest.mark.parametrize(
    ("names", "settings", "threads", "says"),
    [
        (
            ("torch",),
            {},
            1,
            "--threads: none of the runtimes chosen (torch) takes it; onnxruntime, openvino do",
        ),
        (
            ("openvino",),
            {"provider_options": {"a": "b"}},
            0,
            "--provider-option: none of the runtimes chosen (openvino)",
        ),
        (("openvino",), {"flush_denormals": True}, 0, "--flush-denormals: none"),
        (("onnx-reference",), {}, 2, "--threads: none"),
        (("torch", "openvino==2025.4.0"), {"graph_opt": "basic"}, 0, "--graph-opt: none"),
        # taken by ONNX Runtime, but acting on a provider the run does not use (outsider's)
        (("onnxruntime",), {"tf32": True}, 0, "--tf32: acts on cuda only, and the run's"),
        (("onnxruntime",), {"device_id": 9}, 0, "--device-id: acts on cuda only"),
    ],
)
def test_an_option_none_of_the_chosen_runtimes_takes_is_refused(names, settings, threads, says):
    """Passed over, such an option changes nothing while the report says it was given: every
    command (the runtime group, the API, bench's engines) refuses it, naming who takes it."""
    from tconform.runtimes import require_taken

    with pytest.raises(UsageError, match=re.escape(says)):
        require_taken(names, settings, threads, eps=("cpu",))
    if "acts on cuda" in says:  # where the run uses CUDA too, it acts there
        require_taken(names, settings, threads, eps=("cpu", "cuda"))
    require_taken(names, {})  # nothing given: nothing to refuse
    require_taken((*names, "onnxruntime==1.20.1"), settings, threads)  # a release takes it


def test_every_command_refuses_an_option_its_runtimes_do_not_take(cli):
    for args in (
        ["check", "pkg.mod:f", "--runtime", "torch", "--threads", "1"],
        ["verify", "--runtime", "openvino", "--provider-option", "a=b"],
        ["bench", "--engine", "openvino", "--graph-opt", "basic"],
        ["bench", "--generate", "4", "--engine", "torch", "--graph-opt", "basic"],
    ):
        code, out, err = cli(*args)
        assert code == 2 and "none of the runtimes chosen" in err, (args, out + err)


def test_the_api_refuses_an_option_no_runtime_declares():
    assert declared_settings({"tf32": True}) == {"tf32": True}
    with pytest.raises(UsageError, match=r"'tf_32': no runtime takes it.*tf32"):
        declared_settings({"tf_32": True})


def test_onnxruntimes_session_options_keep_its_defaults_and_bench_chooses_its_own(tmp_path):
    """Not given, ONNX Runtime's own defaults stand (verify, check); bench chooses its own
    where they are not given, and a given one wins there too."""
    from tconform.bench.run import bench_settings
    from tconform.runtimes.onnxruntime import (
        DENORMAL_AS_ZERO,
        SKIP_LAYER_NORM_FUSION,
        SPINNING,
        OrtRuntime,
    )

    plain = OrtRuntime()
    assert plain.config_entries() == {} and plain.disabled() == ()

    def timed(**given):
        settings = bench_settings(
            "tiny", ("feed_forward",), (), ("onnxruntime",), "cpu", 1, given, 0, 1, 0.1, tmp_path
        )
        return settings.runtime("onnxruntime", "cpu")

    chosen = timed()
    assert chosen.config_entries() == {SPINNING: "1", DENORMAL_AS_ZERO: "1"}
    assert chosen.disabled() == (SKIP_LAYER_NORM_FUSION,)
    given = timed(spinning=False, flush_denormals=False, skip_layer_norm_fusion=True)
    assert given.config_entries() == {SPINNING: "0", DENORMAL_AS_ZERO: "0"}
    assert given.disabled() == ()


def test_the_reports_line_of_options_names_strict_placement_too():
    """--strict-placement is the request's, not a runtime's, yet decides how sessions ran."""
    from tconform.report import RunReport
    from tconform.results import Result

    report = RunReport("check")
    report.results = [Result("m:f", "module", "onnxruntime", "cpu", ["cpu"], "example", "pass")]
    report.settings = {"runtime_options": ["--threads 1"], "strict_placement": True}
    assert "runtime options: --threads 1 --strict-placement" in report.render()
    report.settings = {"runtime_options": [], "strict_placement": False}
    assert "runtime options" not in report.render()
