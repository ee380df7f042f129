"""A request: what one run checks, and how, as every entry point states it.

The command line (`tconform verify`, `tconform check`), the Python API (`tconform.verify`,
`tconform.check`) and the pytest plugin each build one `Request`; every stage after them reads
its part and nothing else: the plan (tconform.plan) its subject, axes, shard and units, the
runtimes their `RuntimeOptions`, the comparator the tolerance, localisation its own part.

What a request checks is one of three subjects, each a suite of cases (tconform.suites):
  References  tconform's own cases (tconform.registry) against the goldens of a golden folder,
              their models exported to (or held in) an artifacts folder, or given;
  Generations tconform's generation goldens (sequences decoded with a trained checkpoint),
              decoded with the three generation models, exported, held or given;
  UserModel   a user's PyTorch module (PACKAGE.MODULE:FACTORY) against its own float64 copy,
              its model exported by the run, or given.
Everything else (runtimes, the matrix axes, tolerances, localisation, shards, reports) is the
same for both.

Importing this module is cheap (no torch, onnx or onnxruntime): the command line builds a
request before anything slow starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tconform.errors import UsageError

if TYPE_CHECKING:
    from tconform.runtimes import RuntimeOptions

DEFAULT_OPSET = 18  # tconform.export.DEFAULT_OPSET, which this cheap module does not import
LOCALISE_WHEN = ("never", "failure", "always")
ISOLATE = ("first", "all", "none")


def _runtime_options() -> RuntimeOptions:
    from tconform.runtimes import RuntimeOptions

    return RuntimeOptions()


@dataclass(frozen=True)
class Axes:
    """How each case's model is made and run. Without `matrix`, one cell: the subject's own
    settings (an artifacts folder's, a user model's export) at the first graph-optimisation
    level; with it, every cell of exporters x opsets x dtypes x graph_opts."""

    matrix: bool = False
    exporters: tuple[str, ...] = ("dynamo",)
    opsets: tuple[int, ...] = (DEFAULT_OPSET,)
    dtypes: tuple[str, ...] = ("float32",)
    graph_opts: tuple[str, ...] = ("all",)


@dataclass(frozen=True)
class Tolerances:
    """Tolerances the user set: atol and rtol for every output, and per output
    (name -> (atol, rtol)). None: the precision's row of tconform.compare.TOLERANCES."""

    atol: float | None = None
    rtol: float | None = None
    per_output: tuple[tuple[str, tuple[float, float]], ...] = ()

    def __post_init__(self) -> None:
        names = [name for name, _ in self.per_output]
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice is not None:  # which one holds is no one's guess
            raise UsageError(f"--tolerance {twice}=...: given more than once for that output")

    @property
    def given(self) -> bool:
        return self.atol is not None or self.rtol is not None or bool(self.per_output)


@dataclass(frozen=True)
class Localising:
    """Localisation: `when` (never, on a failing result, or always), which modules are cut out
    and run alone (`isolate`: the first divergence, all, none) and where the first
    divergence's repro bundle goes (`repro`)."""

    when: str = "never"
    isolate: str = "first"
    repro: Path | None = None


@dataclass(frozen=True)
class References:
    """tconform's own cases: the goldens of `golden_dir`, the models of `artifacts_dir`
    (exported where missing or stale, or held as they are without `export`), or a given file
    per case (`models`: case -> path, read-only); the documents' checks with `with_doc`."""

    golden_dir: Path = Path("golden")
    artifacts_dir: Path = Path("artifacts")
    cases: tuple[str, ...] = ()
    models: Mapping[str, Path] = field(default_factory=dict)
    export: bool = True
    attention: str | None = None  # the kernel the models must use [the folder's own]
    with_doc: bool = True


@dataclass(frozen=True)
class Generations:
    """tconform's generation goldens in `golden_dir` (those named in `cases`, or all), each
    decoded on every runtime with the key/value cache and without it, by the generation models
    of `artifacts_dir` (exported where missing or stale, or held as they are without `export`)
    or given ones (`models`: gen_encoder, gen_step, gen_prefix -> path, read-only; run on the
    goldens of the preset's mask fill)."""

    golden_dir: Path = Path("golden-generation")
    artifacts_dir: Path = Path("artifacts")
    cases: tuple[str, ...] = ()
    models: Mapping[str, Path] = field(default_factory=dict)
    export: bool = True


@dataclass(frozen=True)
class UserModel:
    """A user's module: `target` names its factory (PACKAGE.MODULE:FACTORY, which returns
    (module, example_inputs), or the module alone with `inputs`, an .npz file). `dynamic`:
    NAME=AXES of inputs whose axes the export keeps free (others are inferred); `model`: an ONNX
    file made elsewhere, checked instead of an export (read-only); `out_dir`: where the run's
    exports go; `padding_mask`: the input whose zeros mark padded positions, left out of the
    comparison; `shapes`: also check at shapes the example never had (batch 1, a larger batch, a
    shorter and a longer sequence), with the batch-consistency check."""

    target: str
    inputs: Path | None = None
    dynamic: tuple[str, ...] = ()
    model: Path | None = None
    out_dir: Path | None = None
    padding_mask: str | None = None
    shapes: bool = True


@dataclass(frozen=True)
class Request:
    """One run: its subject, the runtimes and how they run, the axes, tolerances, localisation,
    and which of the plan's work units this machine checks (a shard, or the units named)."""

    subject: References | Generations | UserModel = field(default_factory=References)
    runtimes: RuntimeOptions = field(default_factory=_runtime_options)
    allow_missing_ep: bool = False
    strict_placement: bool = False
    axes: Axes = field(default_factory=Axes)
    tolerances: Tolerances = field(default_factory=Tolerances)
    localise: Localising = field(default_factory=Localising)
    shard: tuple[int, int] | None = None
    only_units: frozenset[str] | None = None
    command: str = ""  # how the run was started, for a repro bundle's README

    @property
    def whole_run(self) -> bool:
        """Whether this machine checks every unit of the plan (no shard, no units named)."""
        return self.shard is None and self.only_units is None
