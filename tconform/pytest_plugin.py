"""`pytest --tconform`: the work units of a verify run as pytest items.

One item per unit (case x cell x runtime x input set, as tconform.plan lays them out), so that
pytest-xdist (`-n auto`) spreads them over processes and `--junitxml` reports them. A unit that
passes is a pass; a failure or runtime error fails the item with verify's message; a provider
that cannot run, a cell that cannot exist or a missing float16 kernel is a skip with the reason
(never a pass). Items of CUDA runtimes carry the `gpu` marker. With --tconform, the session
runs these items instead of the test files it collected; a session whose every unit was skipped
checked nothing, and ends with exit 5 (pytest's "no tests ran") and a line saying so, never 0.

Loaded by every pytest session of a project that installs tconform (the `pytest11` entry point),
so without --tconform it does nothing and imports nothing beyond pytest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_AXES = {  # option -> VerifyOptions field
    "--tconform-exporter": "exporters",
    "--tconform-opset": "opsets",
    "--tconform-dtype": "dtypes",
    "--tconform-graph-opt": "graph_opts",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tconform", "tconform conformance units")
    group.addoption("--tconform", action="store_true", help="Run tconform's verify units.")
    group.addoption("--tconform-ep", default="cpu", help="Execution providers [cpu].")
    group.addoption("--tconform-golden", default="golden", help="Golden folder [golden].")
    group.addoption(
        "--tconform-artifacts", default="artifacts", help="Artifacts folder [artifacts]."
    )
    group.addoption(
        "--tconform-case", action="append", default=[], help="Only this case (repeatable)."
    )
    group.addoption("--tconform-no-doc", action="store_true", help="Skip the documents' checks.")
    group.addoption("--tconform-matrix", action="store_true", help="verify --matrix.")
    for flag, field in _AXES.items():
        group.addoption(flag, default=None, help=f"Matrix axis ({field}), a comma list.")


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
                terminal.write_line(
                    f"tconform: nothing checked: all {self.skipped} units were skipped "
                    "(their reasons are above); exit 5"
                )


def _options(config: pytest.Config):
    """VerifyOptions from the command line; a bad value is a pytest usage error."""
    import click

    from tconform.commands.verify import MATRIX_AXES
    from tconform.errors import TconformError
    from tconform.plan import VerifyOptions
    from tconform.runtimes import RuntimeOptions
    from tconform.runtimes.providers import parse_eps

    axes = {}
    try:
        for flag, field in _AXES.items():
            value = config.getoption(flag)
            if value is not None:
                axes[field] = MATRIX_AXES[field].convert(value, None, None)
        eps = parse_eps(config.getoption("--tconform-ep"))
    except (click.BadParameter, TconformError) as exc:
        raise pytest.UsageError(f"tconform: {exc}") from None
    if axes and not config.getoption("--tconform-matrix"):
        raise pytest.UsageError("tconform: the matrix axes need --tconform-matrix")
    return VerifyOptions(
        golden_dir=Path(config.getoption("--tconform-golden")),
        artifacts_dir=Path(config.getoption("--tconform-artifacts")),
        runtimes=RuntimeOptions(eps=tuple(eps)),
        cases=tuple(config.getoption("--tconform-case")),
        with_doc=not config.getoption("--tconform-no-doc"),
        matrix=config.getoption("--tconform-matrix"),
        **axes,
    )


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not config.getoption("--tconform"):
        return
    from tconform.errors import TconformError
    from tconform.plan import plan

    options = _options(config)
    try:
        units = plan(options).units
    except TconformError as exc:
        raise pytest.UsageError(f"tconform: {exc}") from None
    if items:
        config.hook.pytest_deselected(items=list(items))
    items[:] = [UnitItem.from_parent(session, name=u.id, unit=u.id, options=options) for u in units]
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
    def __init__(self, *, unit: str, options, **kwargs) -> None:
        super().__init__(**kwargs)
        self.unit = unit
        self.options = options

    def runtest(self) -> None:
        from dataclasses import replace

        from tconform.errors import TconformError
        from tconform.report import RunReport
        from tconform.units import result_unit
        from tconform.verify import verify

        report = RunReport("verify")
        try:
            verify(replace(self.options, only_units=frozenset({self.unit})), report)
        except TconformError as exc:
            raise UnitFailed(f"tconform: error: {exc}") from None
        results = [r for r in report.results if result_unit(r) == self.unit]
        if not results:
            raise UnitFailed("nothing was checked")  # never a pass
        failed = [r for r in results if r.status in ("fail", "error", "crash")]
        if failed:
            raise UnitFailed("; ".join(f"{r.case} [{r.status}]: {r.message}" for r in failed))
        not_run = [r for r in results if r.status != "pass"]
        if not_run:
            pytest.skip("; ".join(f"{r.status}: {r.message}" for r in not_run))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, UnitFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.options.golden_dir, None, UNIT + self.unit
