"""The import contracts of pyproject.toml ([tool.importlinter]): the package's layers, top to
bottom, and no import cycle at any depth (docs/design.md, "Layers"). `lint-imports` checks the
same contracts in CI; this test checks them with the same engine, so that `pytest` alone catches
an upward import, and proves that the contracts see one."""

from pathlib import Path

import pytest

# import-linter is in the test extra; an environment made otherwise (a GPU machine's image) may
# lack it: skipped there with the reason, checked in CI.
grimp = pytest.importorskip("grimp", reason="import-linter is not installed")
from importlinter import configuration  # noqa: E402
from importlinter.application.use_cases import read_user_options  # noqa: E402
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract  # noqa: E402
from importlinter.contracts.layers import LayersContract  # noqa: E402

pytestmark = pytest.mark.unit

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CONTRACT_TYPES = {"layers": LayersContract, "acyclic_siblings": AcyclicSiblingsContract}


@pytest.fixture(scope="module")
def options():
    configuration.configure()  # what the lint-imports command does first
    return read_user_options(str(PYPROJECT))


def graph() -> grimp.ImportGraph:
    """Every import of the package, those inside functions included."""
    return grimp.build_graph("tconform", cache_dir=None)


def broken(options, imports: grimp.ImportGraph) -> list[str]:
    """The names of the contracts that `imports` breaks."""
    found = []
    for contract_options in options.contracts_options:
        cls = CONTRACT_TYPES[contract_options["type"]]
        contract = cls(
            name=contract_options["name"],
            session_options=options.session_options,
            contract_options=contract_options,
        )
        if not contract.check(imports, verbose=False).kept:
            found.append(contract.name)
    return found


def test_every_contract_holds(options):
    assert {c["type"] for c in options.contracts_options} == set(CONTRACT_TYPES)
    assert broken(options, graph()) == []


@pytest.mark.parametrize(
    ("importer", "imported", "contract"),
    [
        ("tconform.errors", "tconform.verify", "layers"),  # the bottom layer reaching the top
        ("tconform.report.merge", "tconform.plan", "layers"),  # a report using a run's plan
        ("tconform.runtimes.base", "tconform.runtimes.onnxruntime", "no cycles"),  # base <-> impl
    ],
)
def test_an_upward_import_or_a_cycle_breaks_a_contract(options, importer, imported, contract):
    imports = graph()
    imports.add_import(importer=importer, imported=imported, line_number=1, line_contents="x")
    assert contract in broken(options, imports)
