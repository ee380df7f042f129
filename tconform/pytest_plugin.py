"""`pytest --tconform`: the work units of a verify run as pytest items.

One item per unit (case x cell x runtime x input set, as tconform.plan lays them out), so that
pytest-xdist (`-n auto`) spreads them over processes and `--junitxml` reports them. A unit that
passes is a pass; a failure or runtime error fails the item with verify's message; a provider
that cannot run, a cell that cannot exist or a missing float16 kernel is a skip with the reason
(never a pass). Items of CUDA runtimes carry the `gpu` marker. With --tconform, the session
runs these items instead of the test files it collected; a session whose every unit was skipped
checked nothing, and ends with exit 5 (pytest's "no tests ran") and a line saying so, never 0.
With --tconform-module PACKAGE.MODULE:FACTORY the units are those of a user's model, as
`tconform check` lays them out (its shapes, its cells), instead of tconform's own cases, and
as there a failing unit's message names the first divergence (--tconform-localise never|
failure|always, check's --localise); with
--tconform-generation, those of the generation goldens (`verify --generation`). One
suite is opened per session (per xdist worker, each with its own export folder) for a user's
model and serves every unit: it is copied and exported once.

Loaded by every pytest session of a project that installs tconform (the `pytest11` entry point),
so without --tconform it does nothing and imports nothing beyond pytest (importing the package
sets ORT_DISABLE_TELEMETRY=1 where it is unset: tconform/__init__.py says why).
"""

from __future__ import annotations

import contextlib

import pytest

_AXES = {  # option -> tconform.request.Axes field
    "--tconform-exporter": "exporters",
    "--tconform-opset": "opsets",
    "--tconform-dtype": "dtypes",
    "--tconform-graph-opt": "graph_opts",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tconform", "tconform conformance units")
    group.addoption("--tconform", action="store_true", help="Run tconform's verify units.")
    group.addoption("--tconform-ep", default="cpu", help="Execution providers [cpu].")
    group.addoption(
        "--tconform-runtime",
        action="append",
        default=[],
        help="A runtime, as `tconform verify --runtime` takes it (repeatable; a release "
        "NAME==VERSION or an interpreter NAME@PYTHON runs in a worker) [onnxruntime, torch].",
    )
    group.addoption(
        "--tconform-golden",
        default=None,
        help="Golden folder [golden; golden-generation with --tconform-generation].",
    )
    group.addoption(
        "--tconform-artifacts", default="artifacts", help="Artifacts folder [artifacts]."
    )
    group.addoption(
        "--tconform-case", action="append", default=[], help="Only this case (repeatable)."
    )
    group.addoption("--tconform-no-doc", action="store_true", help="Skip the documents' checks.")
    group.addoption(
        "--tconform-module",
        metavar="PACKAGE.MODULE:FACTORY",
        help="Check this model (as `tconform check` does) instead of tconform's own cases.",
    )
    from tconform.config import USER_MODEL_OPTIONS  # names and help only: nothing heavy

    for spec in USER_MODEL_OPTIONS.values():  # check's options of a user's model, one by one
        group.addoption(
            _flag(spec.flag),
            action="append" if spec.multiple else "store",
            default=[] if spec.multiple else None,
            metavar=spec.metavar,
            help=f"With --tconform-module, as `tconform check {spec.flag}`: {spec.help}",
        )
    group.addoption(
        "--tconform-localise",
        nargs="?",
        const="failure",
        default=None,
        choices=("never", "failure", "always"),
        help="With --tconform-module, as `tconform check --localise` (by default on a "
        "failure, as there): a failing unit's message names the first module whose own error "
        "leaves tolerance.",
    )
    group.addoption(
        "--tconform-generation",
        action="store_true",
        help="The generation goldens' units (verify --generation) instead of the cases'.",
    )
    group.addoption("--tconform-matrix", action="store_true", help="verify --matrix.")
    for flag, field in _AXES.items():
        group.addoption(flag, default=None, help=f"Matrix axis ({field}), a comma list.")


def _flag(check_flag: str) -> str:
    """The plugin's flag for one of check's: --padding-mask -> --tconform-padding-mask."""
    return "--tconform-" + check_flag.removeprefix("--")


def _in_plugin_terms(text: str) -> str:
    """A message written for `tconform check` with the plugin's flags for check's options
    ("tconform check --dynamic ..." -> "--tconform-dynamic ...")."""
    import re

    from tconform.config import USER_MODEL_OPTIONS

    for check_flag in [*(s.flag for s in USER_MODEL_OPTIONS.values()), "--localise"]:
        text = re.sub(
            rf"(tconform check )?(?<![\w-]){check_flag}(?![\w-])", _flag(check_flag), text
        )
    return text


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a usable CUDA execution provider")
    if config.getoption("--tconform") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Outcomes(), "tconform-outcomes")  # xdist's controller


UNIT = "tconform unit "  # how a unit's report names it (UnitItem.reportinfo)


class _Outcomes:
    """Whether any unit was checked (ran and passed or failed). Counted where the reports
    arrive (the xdist controller, or the one process), from the reports alone."""

    def __init__(self) -> None:
        self.checked = self.skipped = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.location[2].startswith(UNIT):
            return
        if report.skipped:
            self.skipped += 1
        elif report.when == "call":
            self.checked += 1

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.skipped and not self.checked and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
            terminal = session.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                terminal.ensure_newline()  # after the progress dots, on a line of its own
                terminal.write_line(
                    f"tconform: nothing checked: all {self.skipped} units were skipped "
                    "(their reasons are above); exit 5"
                )


def _request(config: pytest.Config):
    """The run's Request from the command line; a bad value is a pytest usage error."""
    import click

    from tconform.commands.options import MATRIX_AXES, FolderPath, ModuleChoice
    from tconform.config import USER_MODEL_OPTIONS
    from tconform.errors import TconformError
    from tconform.request import Axes, Generations, Localising, References, Request
    from tconform.runtimes import RuntimeOptions, runtime_class, spec_of
    from tconform.runtimes.providers import parse_eps

    axes = {}
    generation = config.getoption("--tconform-generation")
    golden = config.getoption("--tconform-golden") or (
        "golden-generation" if generation else "golden"
    )
    try:
        for flag, field in _AXES.items():
            value = config.getoption(flag)
            if value is not None:
                axes[field] = MATRIX_AXES[field].convert(value, None, None)
        eps = parse_eps(config.getoption("--tconform-ep"))
        names = tuple(config.getoption("--tconform-runtime") or ()) or RuntimeOptions.names
        for name in names:
            runtime_class(spec_of(name).name)  # an unknown runtime or a bad spec: one line
        folder = FolderPath()  # the command's own checks of a folder option (type, name lengths)
        golden_dir = folder.convert(golden, None, None)
        artifacts_dir = folder.convert(config.getoption("--tconform-artifacts"), None, None)
    except (click.BadParameter, TconformError) as exc:
        raise pytest.UsageError(f"tconform: {exc}") from None
    values = {name: config.getoption(_flag(s.flag)) for name, s in USER_MODEL_OPTIONS.items()}
    for name, value in values.items():
        if value and not config.getoption("--tconform-module"):
            flag = _flag(USER_MODEL_OPTIONS[name].flag)
            raise pytest.UsageError(f"tconform: {flag} is for a user's model (--tconform-module)")
    localise = config.getoption("--tconform-localise")
    if localise is not None and not config.getoption("--tconform-module"):
        raise pytest.UsageError("tconform: --tconform-localise is for a user's model")
    if axes and not config.getoption("--tconform-matrix"):
        raise pytest.UsageError("tconform: the matrix axes need --tconform-matrix")
    target = config.getoption("--tconform-module")
    if target:
        from tconform.check_folder import require_target

        try:
            require_target(target)
        except TconformError as exc:
            raise pytest.UsageError(f"tconform: {exc}") from None
        try:
            module = ModuleChoice.converted(values)
        except (click.BadParameter, TconformError) as exc:
            raise pytest.UsageError(f"tconform: {_in_plugin_terms(str(exc))}") from None
        subject = module.subject(target, _worker_folder(config, target))
        axes.setdefault("exporters", ("auto",))
    elif generation:
        subject = Generations(golden_dir, artifacts_dir, tuple(config.getoption("--tconform-case")))
    else:
        subject = References(
            golden_dir,
            artifacts_dir,
            tuple(config.getoption("--tconform-case")),
            with_doc=not config.getoption("--tconform-no-doc"),
        )
    return Request(
        subject,
        runtimes=RuntimeOptions(names, eps=tuple(eps)),
        axes=Axes(matrix=config.getoption("--tconform-matrix"), **axes),
        localise=Localising(localise or ("failure" if target else "never")),
    )


def _worker_folder(config: pytest.Config, target: str):
    """An xdist worker's own export folder (`artifacts/check/NAME.gw0`): each worker opens the
    model's suite for the session and holds its folder's lock meanwhile (None: the default)."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:
        return None
    from tconform.check_folder import export_folder

    folder = export_folder(target, None)
    return folder.with_name(f"{folder.name}.{worker}")


class _Suites:
    """Where the session's units run. A user's model's suite is opened once, at collection, and
    kept for every unit, so that the model is copied and exported once, not once per unit.
    tconform's own cases get a suite per unit: it holds the golden and artifacts folders' locks
    only while the unit runs, since xdist's other workers export into the same folders."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.kept = None

    def suite(self, request):
        from tconform.request import UserModel
        from tconform.suites import open_suite

        if not isinstance(request.subject, UserModel):
            return open_suite(request)
        if self.kept is None:
            self.kept = self.stack.enter_context(open_suite(request))
        return contextlib.nullcontext(self.kept)

    def pytest_sessionfinish(self) -> None:
        self.stack.close()


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not config.getoption("--tconform"):
        return
    from tconform.errors import TconformError
    from tconform.plan import plan
    from tconform.variables import check_environment

    try:
        check_environment()
    except TconformError as exc:
        raise pytest.UsageError(f"tconform: {exc}") from None
    request = _request(config)
    suites = _Suites()
    config.pluginmanager.register(suites, "tconform-suites")
    try:
        with suites.suite(request) as suite:
            planned = plan(request, suite)
            suite.require_inputs(planned.lanes)  # bad input is a usage error, not failed units
            units = planned.units
    except TconformError as exc:
        raise pytest.UsageError(f"tconform: {_in_plugin_terms(str(exc))}") from None
    if items:
        config.hook.pytest_deselected(items=list(items))
    items[:] = [
        UnitItem.from_parent(session, name=u.id, unit=u.id, request=request, suites=suites)
        for u in units
    ]
    for item, unit in zip(items, units, strict=True):
        if "cuda" in unit.runtime:
            item.add_marker(pytest.mark.gpu)
    # Collected here rather than by a collector: say so, so that the counts (`--collect-only`'s
    # "N tests collected") include them.
    config.hook.pytest_collectreport(
        report=pytest.CollectReport(session.nodeid, "passed", None, list(items))
    )


class UnitFailed(Exception):
    """A unit that ran and failed: its message is the report, without a traceback."""


class UnitItem(pytest.Item):
    def __init__(self, *, unit: str, request, suites: _Suites, **kwargs) -> None:
        super().__init__(**kwargs)
        self.unit = unit
        self.request = request
        self.suites = suites

    def runtest(self) -> None:
        from dataclasses import replace

        from tconform.errors import TconformError, UsageError
        from tconform.pipeline import run
        from tconform.report import RunReport, rendered_localisations
        from tconform.request import UserModel
        from tconform.units import result_unit

        report = RunReport("verify")
        request = replace(self.request, only_units=frozenset({self.unit}))
        try:
            with self.suites.suite(request) as suite:
                run(request, suite, report, lambda _: None)
        except UsageError as exc:  # bad input found as the unit ran: the session's error
            pytest.exit(f"tconform: error: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        except TconformError as exc:
            raise UnitFailed(f"tconform: error: {exc}") from None
        results = [r for r in report.results if result_unit(r) == self.unit]
        if not results:
            raise UnitFailed("nothing was checked")  # never a pass
        terms = _in_plugin_terms if isinstance(request.subject, UserModel) else str
        failed = [r for r in results if r.status in ("fail", "error", "crash")]
        if failed:
            said = "; ".join(f"{r.case} [{r.status}]: {r.message}" for r in failed)
            raise UnitFailed(
                terms("\n\n".join([said, *rendered_localisations(report.localisations)]))
            )
        not_run = [r for r in results if r.status != "pass"]
        if not_run:
            pytest.skip(terms("; ".join(f"{r.status}: {r.message}" for r in not_run)))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, UnitFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        from tconform.request import UserModel

        subject = self.request.subject
        where = subject.target if isinstance(subject, UserModel) else subject.golden_dir
        return where, None, UNIT + self.unit
