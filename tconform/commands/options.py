"""Options and click types shared by the commands, defined once.

Bad values are click usage errors (exit 2, click's one-line message naming the option), found
when the command line is parsed, before anything slow starts: report paths are checked for
writability up front, so a run is never lost to a typo in `--json`.
Importing this module stays cheap (no torch, onnx or onnxruntime): `tconform --help` is fast.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import click

from tconform.config import (
    ATTENTION_KERNELS,
    DEFAULT_PRESET,
    DEFAULT_SEED,
    EXPORTERS,
    MAX_SEED,
    MODEL_DTYPES,
    OPSETS,
    PLANNED_DTYPES,
    PRESETS,
    USER_MODEL_OPTIONS,
)
from tconform.errors import UsageError
from tconform.files import INSIDE_ROOM, require_name_fits, require_utf8_name, resolved, shown
from tconform.runtimes import MAX_THREADS

# ASCII digits only, at most nine: `\d` and str.isdigit accept other scripts' digits (and `²`,
# which int() refuses), and a count of twenty digits would size a list.
SHAPE = re.compile(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*")
SHARD = re.compile(r"\s*([0-9]{1,9})\s*/\s*([0-9]{1,9})\s*")
MAX_BATCH = 65536  # far beyond anything a bench or a check runs; memory is checked separately


class ShapeType(click.ParamType):
    """'8x128' -> (8, 128): batch x sequence, each at least 1."""

    name = "BATCHxSEQ"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        found = SHAPE.fullmatch(str(value))
        if not found:
            self.fail(f"{value!r:.60} is not BATCHxSEQ (e.g. 8x128)", param, ctx)
        # more than nine digits is out of range, and never handed to int() (which refuses
        # over 4300 digits)
        too_long = any(len(group) > 9 for group in found.groups())
        batch, seq = (0, 0) if too_long else (int(found.group(1)), int(found.group(2)))
        if not 1 <= batch <= MAX_BATCH or seq < 1:
            self.fail(
                f"{value!r:.60}: batch must be 1..{MAX_BATCH} and sequence 1..999999999", param, ctx
            )
        return batch, seq


class InputSetName(click.ParamType):
    """An input set of a user's model, as tconform check names them: example, batch-N, seq-N
    (made where the batch or sequence axis is free), or all. Whether the model has the one
    named is known once its factory ran; a name of no input set is refused before that."""

    name = "NAME"
    NAMES = re.compile(r"example|all|(batch|seq)-[1-9][0-9]{0,8}")

    def convert(self, value, param, ctx) -> str:
        if not self.NAMES.fullmatch(str(value)):
            self.fail(f"{value!r:.60} is no input set: example, batch-N, seq-N or all", param, ctx)
        return str(value)


class RuntimeName(click.ParamType):
    """A runtime: a key of tconform.runtimes.RUNTIMES (read when the option is parsed, so that a
    runtime added to the registry is a choice with no edit here), or a spec naming a release or
    an interpreter of one (NAME==VERSION, NAME@PYTHON: tconform.runtimes.specs)."""

    name = "runtime"

    def get_metavar(self, param, ctx=None) -> str:
        from tconform.runtimes import RUNTIMES

        return "[" + "|".join(RUNTIMES) + "][==VERSION][@PYTHON]"

    def convert(self, value, param, ctx) -> str:
        from tconform.runtimes import RUNTIMES
        from tconform.runtimes.specs import parse_spec

        try:
            spec = parse_spec(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if spec.name not in RUNTIMES:
            self.fail(f"{spec.name!r} is not one of {', '.join(RUNTIMES)}", param, ctx)
        return spec.text


class ShardType(click.ParamType):
    """'2/3' -> (2, 3): shard K of N, 1 <= K <= N, each written in ASCII digits (at most nine:
    a shard count sizes nothing, tconform.units.split allocates only the shards that hold
    work)."""

    name = "K/N"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        found = SHARD.fullmatch(str(value))
        if not found:
            self.fail(f"{value!r} is not K/N (e.g. 2/3; digits 0-9, at most nine)", param, ctx)
        index, count = int(found.group(1)), int(found.group(2))
        if not 1 <= index <= count:
            self.fail(f"{value!r}: K must be 1..N (shards are numbered from 1)", param, ctx)
        return index, count


class CommaList(click.ParamType):
    """'a,b' -> ('a', 'b'), each value one of `choices()` (a callable, so that a list held by a
    heavy module is read only when the option is given); `convert` turns each into its type."""

    name = "LIST"

    def __init__(self, choices, convert=str) -> None:
        self.choices = choices
        self.to_value = convert

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = [item.strip() for item in str(value).split(",")]
        if not any(items):
            self.fail(f"{value!r} is empty: give at least one value", param, ctx)
        if not all(items):  # '18,,20': a value left out is a typo, not one value fewer
            self.fail(f"{value!r}: an empty value between commas", param, ctx)
        allowed = [str(c) for c in self.choices()]
        for n, item in enumerate(items):
            if item not in allowed:
                self.fail(f"unknown value {item!r}; choose from {', '.join(allowed)}", param, ctx)
            if item in items[:n]:
                self.fail(f"{item!r} given twice", param, ctx)
        return tuple(self.to_value(item) for item in items)


# Files a report must never replace: models and tensors (a given model under test among them).
NOT_A_REPORT = (".onnx", ".pb", ".data")


class ReportPath(click.ParamType):
    """A file a report will be written to, checked before the run: its name fits the file
    system with the temporary file written beside it (files.require_name_fits), its folder
    exists and is writable, it is not a folder itself, it has the suffix its format needs, it is
    not a model or tensor file, it is not a symbolic link (writing would replace the link), and
    it does not lie inside a golden or artifacts folder. That an existing file is a report
    tconform wrote is checked by the run frame (tconform.commands.run), which knows the
    report's kind."""

    name = "FILE"

    def __init__(self, suffix: str | None = None) -> None:
        self.suffix = suffix

    def convert(self, value, param, ctx):
        path = Path(value)
        with _usable(value, param, ctx, self):
            require_name_fits(path)
            self._check(path, param, ctx)
        return path

    def _check(self, path: Path, param, ctx) -> None:
        if str(path).startswith("-"):  # `--json --no-torch`: the option's value went missing
            self.fail(
                f"{shown(path)}: looks like an option, not a file (a file of that name: "
                f"./{shown(path)})",
                param,
                ctx,
            )
        if self.suffix and path.suffix.lower() != self.suffix:
            self.fail(f"{shown(path)}: the file must end in {self.suffix}", param, ctx)
        if path.is_symlink():
            self.fail(f"{shown(path)}: a symbolic link; name a file of its own", param, ctx)
        from tconform.folders import REPRO_BUNDLE, managed_folder, require_not_link

        try:  # nor through a link on the way to it, as every folder tconform writes in
            require_not_link(path.parent, "the report's folder")
        except UsageError as exc:
            self.fail(str(exc), param, ctx)
        if path.is_dir():
            self.fail(f"{shown(path)}: is a folder", param, ctx)
        if path.suffix.lower() in NOT_A_REPORT:
            self.fail(f"{shown(path)}: a model or tensor file name, not a report's", param, ctx)
        inside = managed_folder(path)
        if inside is not None:
            bundle = managed_folder(path, (REPRO_BUNDLE,)) == inside
            what = (
                "a bundle tconform check --repro wrote"
                if bundle
                else "a tconform golden, artifacts or check export folder"
            )
            self.fail(f"{shown(path)}: inside {inside}, {what}; reports go elsewhere", param, ctx)
        if path.exists() and not path.is_file():
            self.fail(f"{shown(path)}: exists and is not a regular file", param, ctx)
        folder = path.parent
        if not folder.is_dir():
            self.fail(f"{shown(path)}: folder {shown(folder)} does not exist", param, ctx)
        if not os.access(folder, os.W_OK | os.X_OK) or (
            path.exists() and not os.access(path, os.W_OK)
        ):
            self.fail(f"{shown(path)}: not writable", param, ctx)


@contextlib.contextmanager
def _usable(value, param, ctx, kind: click.ParamType) -> Iterator[None]:
    """Around a path option's checks: a path the system refuses to look at (a NUL in it, a
    loop of symlinks), or a name that does not fit, is the option's one line; so is an empty
    one, which pathlib reads as the current folder."""
    if isinstance(value, str) and not value.strip():
        kind.fail(f"{value!r}: an empty path (name a file or folder)", param, ctx)
    try:
        yield
    except UsageError as exc:
        kind.fail(str(exc), param, ctx)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        kind.fail(f"{shown(str(value))!r}: not a usable path ({why})", param, ctx)


class RegularFile(click.ParamType):
    """A file the command will read, checked before anything opens it: it exists and is a
    regular file (a folder, a FIFO, a device such as /dev/zero or a socket would block a read or
    never end it)."""

    name = "FILE"

    def convert(self, value, param, ctx):
        path = Path(value)
        with _usable(value, param, ctx, self):
            require_name_fits(path, room=0)  # read, never written beside
            if not path.exists():
                self.fail(f"{shown(path)}: no such file", param, ctx)
            if path.is_dir():
                self.fail(f"{shown(path)}: is a folder, not a file", param, ctx)
            if not path.is_file():
                self.fail(
                    f"{shown(path)}: not a regular file (a device, pipe or socket)", param, ctx
                )
            if not os.access(path, os.R_OK):
                self.fail(f"{shown(path)}: not readable", param, ctx)
        return path


class ModuleModelFile(RegularFile):
    """The ONNX file of a user's module (check and bench --model): one file, where verify's
    --model is CASE=FILE; a CASE=FILE given here says so rather than that no such file is."""

    def convert(self, value, param, ctx):
        case, is_pair, file = str(value).partition("=")
        if is_pair and case and not Path(value).exists() and Path(file).is_file():
            self.fail(
                f"{shown(value)}: takes the ONNX file of FACTORY's module alone (CASE=FILE is "
                "verify's --model, for tconform's own cases)",
                param,
                ctx,
            )
        return super().convert(value, param, ctx)


class InputsArchive(RegularFile):
    """--inputs FILE.npz, read before the run: an archive of arrays of bool, integers or
    floating point (their names are matched with the module's once it is made)."""

    name = "FILE.npz"

    def convert(self, value, param, ctx):
        path = super().convert(value, param, ctx)
        from tconform.module_check.inputs import read_arrays

        with _usable(value, param, ctx, self):
            require_utf8_name(path, "and it names the input set in every report")
            read_arrays(path)
        return path


class FolderPath(click.ParamType):
    """A folder the command reads or writes: new, or an existing folder; anything else there (a
    file, a FIFO, a device) is refused before the run, naming it. Its name leaves room for what
    tconform writes beside it (its lock, its staging copy)."""

    name = "DIRECTORY"

    def convert(self, value, param, ctx):
        path = Path(value)
        with _usable(value, param, ctx, self):
            require_name_fits(path, inside=INSIDE_ROOM)
            require_utf8_name(path)  # models are written and read there
            if (path.exists() or path.is_symlink()) and not path.is_dir():
                self.fail(f"{shown(path)}: exists and is not a folder", param, ctx)
        return path


class KeyValue(click.ParamType):
    """'KEY=VALUE' -> (KEY, VALUE), both non-empty, no space in KEY."""

    name = "KEY=VALUE"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        key, sep, text = str(value).partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text or any(c.isspace() for c in key):
            self.fail(f"{value!r} is not KEY=VALUE (e.g. use_tf32=0)", param, ctx)
        return key, text


class WholeNumber(click.IntRange):
    """click's IntRange, in ASCII digits: Python's int() also reads '１' (a full-width digit) and
    '1_000', which a report would then record as the number the user never typed."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not re.fullmatch(r"[+-]?[0-9]+", value):
            self.fail(f"{value!r} is not a whole number in the digits 0-9", param, ctx)
        return super().convert(value, param, ctx)


class FiniteRange(click.FloatRange):
    """click's FloatRange, finite: NaN compares false with every bound, so FloatRange lets it
    (and, without a maximum, infinity) through."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class ToleranceValue(click.ParamType):
    """A tolerance: a finite number >= 0 (tconform.compare.tolerance_value, which
    tconform.check applies to the same values given from Python)."""

    name = "FLOAT"

    def convert(self, value, param, ctx):
        if isinstance(value, float) and math.isfinite(value) and value >= 0:
            return value
        from tconform.compare import tolerance_value
        from tconform.errors import UsageError

        try:
            return tolerance_value(value, str(value))
        except UsageError:
            self.fail(f"{value!r} must be a finite number >= 0", param, ctx)


class OutputTolerance(click.ParamType):
    """'OUTPUT=ATOL,RTOL' -> (OUTPUT, (ATOL, RTOL)), each tolerance a ToleranceValue."""

    name = "OUTPUT=ATOL,RTOL"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        from tconform.compare import tolerance_value
        from tconform.errors import UsageError

        name, sep, values = str(value).partition("=")
        parts = values.split(",")
        if not sep or not name.strip() or len(parts) != 2:
            self.fail(f"{value!r}: expected OUTPUT=ATOL,RTOL, e.g. out=1e-4,1e-4", param, ctx)
        try:
            atol, rtol = (tolerance_value(part.strip(), part.strip()) for part in parts)
        except UsageError:
            self.fail(f"{value!r}: ATOL and RTOL must be finite numbers >= 0", param, ctx)
        return name.strip(), (atol, rtol)


class OneOf(click.ParamType):
    """One of `values` (a runtime option's: ONNX Runtime's graph-optimisation levels)."""

    name = "VALUE"

    def __init__(self, values: tuple[str, ...]) -> None:
        self.values = values

    def get_metavar(self, param, ctx=None) -> str:
        return "[" + "|".join(self.values) + "]"

    def convert(self, value, param, ctx):
        if value not in self.values:
            hint = " (one value; --matrix takes lists: see --help)" if "," in str(value) else ""
            self.fail(f"{value!r} is not one of {', '.join(self.values)}{hint}", param, ctx)
        return value


def require_reports_apart(inputs, *reports, what: str = "an input of this run") -> None:
    """No report may be written over a file the run reads or keeps (a model under test, a
    shard report being merged, tconform check's own files), whatever that file is called; the
    refusal is Refused, so that no report, not even the error's, is written there."""
    from tconform.errors import Refused

    kept = {resolved(Path(path)) for path in inputs}
    for report in reports:
        if report is not None and resolved(Path(report)) in kept:
            raise Refused(f"{report}: {what}; reports go elsewhere", Path(report))


def preset_option(default: str = DEFAULT_PRESET):
    return click.option(
        "--preset",
        type=click.Choice(list(PRESETS)),
        default=default,
        show_default=True,
        help="Model dimensions and variant options.",
    )


def attention_option(help: str):
    """--attention plain|sdpa: how the exported graphs compute attention."""
    return click.option(
        "--attention",
        type=click.Choice(ATTENTION_KERNELS),
        default=None,
        help="Attention kernel of the exported graphs: plain (MatMul, Softmax, ... written out) "
        "or sdpa (torch's scaled_dot_product_attention, one ONNX Attention node at opset 23 that "
        "ONNX Runtime runs fused; same function, docs/performance.md). " + help,
    )


def case_option(help: str = "Only this case (repeatable)."):
    return click.option("--case", "cases", multiple=True, metavar="CASE", help=help)


def seed_option():
    return click.option(
        "--seed",
        type=WholeNumber(0, MAX_SEED),
        default=DEFAULT_SEED,
        show_default=True,
        help="Seed of the weights and inputs.",
    )


def folder_option(flag: str, dest: str, default: Path, help: str):
    """An option naming a folder (never a file), with its default shown."""
    return click.option(
        flag,
        dest,
        type=FolderPath(),
        default=default,
        show_default=True,
        help=help,
    )


def artifacts_option(help: str):
    return folder_option("--artifacts", "artifacts_dir", Path("artifacts"), help)


def report_options(*formats: str):
    """The report group: one option per format of tconform.report.formats.FORMATS (`--json`,
    `--junit`, `--markdown`, `--plot`), each a ReportPath checked before the run. The command
    receives them as one `reports` parameter (format -> path or None); two naming one file, or
    one given twice (a script that appends `--json B` to a line holding `--json A` would
    silently lose A), is a usage error."""
    from tconform.report.formats import FORMATS

    def once(fmt: str, given: tuple) -> object:
        if len(given) > 1:
            raise click.UsageError(
                f"{FORMATS[fmt].flag} given {len(given)} times ({', '.join(map(str, given))}): "
                "one file per format"
            )
        return given[0] if given else None

    def decorate(command):
        @functools.wraps(command)
        def with_reports(*args, **kwargs):
            reports = {fmt: once(fmt, kwargs.pop(FORMATS[fmt].dest)) for fmt in formats}
            named: dict[Path, str] = {}
            for fmt, path in reports.items():
                if path is None:
                    continue
                first = named.setdefault(resolved(path), FORMATS[fmt].flag)
                if first != FORMATS[fmt].flag:
                    raise click.UsageError(
                        f"{first} and {FORMATS[fmt].flag} name the same file, {shown(path)}: "
                        "give each its own"
                    )
            _require_reports_outside_folders(reports, kwargs)
            return command(*args, reports=reports, **kwargs)

        for fmt in reversed(formats):
            spec = FORMATS[fmt]
            with_reports = click.option(
                spec.flag, spec.dest, type=ReportPath(spec.suffix), multiple=True, help=spec.help
            )(with_reports)
        return with_reports

    return decorate


def _require_reports_outside_folders(reports: dict, params: dict) -> None:
    """No report inside a folder the command reads or writes (each FolderPath option:
    --golden, --artifacts, --out, --repro), even one that does not exist yet: the run would
    make it a golden or artifacts folder holding a file that is not its own."""
    context = click.get_current_context(silent=True)
    options = context.command.params if context is not None else []
    folders = [
        (param.opts[0], params[param.name])
        for param in options
        if isinstance(param.type, FolderPath) and params.get(param.name) is not None
    ]
    require_reports_outside(reports, folders)


def require_reports_outside(reports: dict, folders: list[tuple[str, Path]]) -> None:
    """No report inside any of `folders` ((its option, the folder): a command's folder that
    defaults to one named after its target, check's export folder, is checked here once it is
    known). `--repro` naming the current folder or one above is left to its own check, which
    refuses it, so that the line names it and a report beside the user's work is written."""
    from tconform.errors import Refused

    for report in (path for path in reports.values() if path is not None):
        for option, folder in folders:
            if option == "--repro" and Path.cwd().is_relative_to(resolved(folder)):
                continue
            if resolved(report).is_relative_to(resolved(folder)):
                raise Refused(
                    f"{report}: inside {folder}, the {option} folder of this run; reports "
                    "go elsewhere",
                    report,
                )


# --- the runtime group ---------------------------------------------------------------------------

DEFAULT_RUNTIMES = ("onnxruntime", "torch")


@dataclass(frozen=True)
class RuntimeChoice:
    """What a command's runtime options asked for. `options()` builds the one
    tconform.runtimes.RuntimeOptions every runtime is made from (it parses --ep, which looks at
    ONNX Runtime, so commands call it inside their run, where its errors are reported)."""

    names: tuple[str, ...] = DEFAULT_RUNTIMES  # --runtime (the command's default when not given)
    ep_spec: str = "cpu"
    # the options runtimes declare that were given, by field (tconform.runtimes.RuntimeOptions)
    settings: Mapping[str, object] = field(default_factory=dict)
    threads: int | None = None  # None: the command's default
    allow_missing_ep: bool = False
    strict_placement: bool = False

    def request_fields(self, crash_folder: Path | None = None) -> dict[str, object]:
        """What a tconform.request.Request takes of the runtime group."""
        return {
            "runtimes": self.options(crash_folder),
            "allow_missing_ep": self.allow_missing_ep,
            "strict_placement": self.strict_placement,
        }

    def options(self, crash_folder: Path | None = None):
        """The runtimes' options; `crash_folder`: where a runtime in a worker that crashes
        writes its repro bundle (`crash_folder_beside` the command's reports)."""
        from tconform.runtimes import RuntimeOptions, require_taken
        from tconform.runtimes.providers import parse_eps

        eps = tuple(parse_eps(self.ep_spec))
        require_taken(self.names, self.settings, self.threads or 0, eps)
        return RuntimeOptions(
            self.names,
            eps,
            settings=dict(self.settings),
            threads=self.threads or 0,
            crash_folder=crash_folder,
        )


def crash_folder_beside(*paths: Path | None) -> Path | None:
    """Where a crashed runtime's repro bundles go: beside the first of the command's reports
    (or other folders of its own) given, named after it ('reports/verify.json' ->
    'reports/verify.crash-XXXXXX/', a new folder each); None where none is given."""
    given = next((Path(p) for p in paths if p is not None), None)
    return given.with_name(f"{given.stem}.crash") if given is not None else None


def _runtime_option(dest, *decls, **attrs):
    return dest, lambda **changes: click.option(*decls, dest, **{**attrs, **changes})


# name -> (the command's parameter, a click.option factory): each option defined once.
RUNTIME_OPTIONS = dict(
    (
        _runtime_option(
            "runtime_names",
            "--runtime",
            multiple=True,
            type=RuntimeName(),
            help="Runtime to run on (repeatable; tconform.runtimes.RUNTIMES) "
            f"[{', '.join(DEFAULT_RUNTIMES)}]; e.g. onnx-reference (ONNX's own reference "
            "evaluator), openvino. NAME==VERSION runs that release, in an environment made on "
            "first use and kept; NAME@PYTHON the one that interpreter has; each in a worker "
            "process of its own, where a crash is the row's verdict (docs/versions.md).",
        ),
        _runtime_option(
            "ep_spec",
            "--ep",
            default="cpu",
            show_default=True,
            help="Execution providers: cpu, cuda, a comma list, or all (every one that runs here).",
        ),
        _runtime_option(
            "threads",
            "--threads",
            type=WholeNumber(1, MAX_THREADS),
            default=None,
            help="Intra-op threads per session [the runtime's default].",
        ),
        _runtime_option(
            "allow_missing_ep",
            "--allow-missing-ep",
            is_flag=True,
            help="Report a requested provider that cannot run as skip (with the reason) instead "
            "of exiting 3.",
        ),
        _runtime_option(
            "strict_placement",
            "--strict-placement",
            is_flag=True,
            help="Fail a result when nodes fell back from the requested provider to the CPU.",
        ),
        _runtime_option(
            "no_torch", "--no-torch", is_flag=True, help="Leave out the PyTorch rows (torch)."
        ),
    )
)


def runtime_options(*names: str, ep: str = "cpu", threads: str | None = None):
    """The runtime group: the options of RUNTIME_OPTIONS named (`runtime`, `ep`, `threads`,
    `allow_missing_ep`, `strict_placement`, `no_torch`) and every option a runtime declares
    (a RuntimeCommand adds those), which the command receives as one `runtime` parameter, a
    RuntimeChoice. `ep` is the --ep default, `threads` what --threads defaults to."""
    keys = {"runtime": "runtime_names", "ep": "ep_spec"}
    dests = [keys.get(name, name) for name in names]
    unknown = [n for n in dests if n not in RUNTIME_OPTIONS]
    if unknown:
        raise ValueError(f"no runtime option {unknown[0]!r}")
    changes = {"ep_spec": {"default": ep}}
    if threads:
        changes["threads"] = {"help": f"Intra-op threads per session [{threads}]."}

    def decorate(command):
        @functools.wraps(command)
        def with_runtime(*args, **kwargs):
            given = {dest: kwargs.pop(dest) for dest in dests}
            names = tuple(dict.fromkeys(given.pop("runtime_names", ()) or DEFAULT_RUNTIMES))
            if given.pop("no_torch", False):
                names = tuple(n for n in names if n != "torch")
                if not names:
                    raise click.UsageError("--no-torch leaves no runtime to run on")
            settings = _declared_values(kwargs)
            runtime = RuntimeChoice(names, settings=settings, **given)
            return command(*args, runtime=runtime, **kwargs)

        for dest in reversed(dests):
            with_runtime = RUNTIME_OPTIONS[dest](**changes.get(dest, {}))(with_runtime)
        return with_runtime

    return decorate


class RuntimeCommand(click.Command):
    """A command with the runtime group: the options runtimes declare (Runtime.options) join
    its own when it parses or shows its help, not when tconform starts (reading them imports
    every runtime, torch's among them), and again when a runtime joins RUNTIMES."""

    declared: tuple = ()

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        from tconform.runtimes import declared_options

        declared = tuple(declared_options().values())
        if declared != self.declared:
            own = [p for p in self.params if not isinstance(p, _DeclaredOption)]
            self.params = own + [_DeclaredOption(option) for option in declared]
            self.declared = declared
        return super().get_params(ctx)


class _DeclaredOption(click.Option):
    """A runtime's declared option on the command line; not given, it is None (or () for a
    repeatable one) and the runtime's own default stands."""

    def __init__(self, option) -> None:
        attrs: dict[str, object] = {"help": option.help, "default": None}
        flag = option.flag
        if option.kind is bool:
            flag = f"{option.flag}/--no-{option.flag.removeprefix('--')}"
        elif option.kind is int:
            attrs["type"] = WholeNumber(*(option.bounds or (None, None)))
        elif option.kind is dict:
            attrs.update(multiple=True, type=KeyValue(), default=())
        else:
            attrs["type"] = OneOf(option.kind)
        super().__init__([flag, option.field], **attrs)


def _declared_values(kwargs: dict) -> dict[str, object]:
    """The options runtimes declare that were given, taken out of a command's parameters, by
    field (one not given keeps its runtime's default)."""
    from tconform.runtimes import declared_options

    settings = {}
    for name, option in declared_options().items():
        value = kwargs.pop(name, None)
        if value is not None and value != ():
            settings[name] = dict(value) if option.kind is dict else value
    return settings


# --- the tolerance group -------------------------------------------------------------------------


# --- a user's model (PACKAGE.MODULE:FACTORY) -----------------------------------------------------

# The types the command line gives USER_MODEL_OPTIONS (the others are text)
_MODULE_TYPES = {"inputs": InputsArchive(), "model": ModuleModelFile()}
MODULE_OPTIONS = {
    name: click.option(
        spec.flag,
        name,
        type=_MODULE_TYPES.get(name),
        multiple=spec.multiple,
        metavar=spec.metavar,
        help=spec.help,
    )
    for name, spec in USER_MODEL_OPTIONS.items()
}


@dataclass(frozen=True)
class ModuleChoice:
    """What the options of MODULE_OPTIONS say of a user's model, given to a command as one
    `module` parameter; `subject` makes the request's UserModel of it."""

    inputs: Path | None = None
    dynamic: tuple[str, ...] = ()
    model: Path | None = None
    padding_mask: str | None = None

    def given(self) -> list[str]:
        """The options given, as the command line names them."""
        return [USER_MODEL_OPTIONS[name].flag for name, value in vars(self).items() if value]

    @classmethod
    def converted(cls, values: Mapping[str, object]) -> ModuleChoice:
        """From values as text (the pytest plugin's --tconform-NAME), each checked by its type
        as the command line checks it (click.BadParameter naming the flag)."""
        given = {}
        for name, value in values.items():
            kind = _MODULE_TYPES.get(name)
            if value and kind is not None:
                try:
                    value = kind.convert(value, None, None)
                except click.BadParameter as exc:
                    raise click.BadParameter(f"{USER_MODEL_OPTIONS[name].flag}: {exc}") from None
            multiple = USER_MODEL_OPTIONS[name].multiple
            given[name] = tuple(value or ()) if multiple else value or None
        return cls(**given)

    def subject(self, target: str, out_dir: Path, shapes: bool = True):
        from tconform.request import UserModel

        return UserModel(
            target, self.inputs, self.dynamic, self.model, out_dir, self.padding_mask, shapes
        )


def module_options(*names: str):
    """The options of a user's model named (keys of MODULE_OPTIONS), received by the command
    as one `module` parameter, a ModuleChoice."""

    def decorate(command):
        @functools.wraps(command)
        def with_module(*args, **kwargs):
            given = {name: kwargs.pop(name) for name in names}
            return command(*args, module=ModuleChoice(**given), **kwargs)

        for name in reversed(names):
            with_module = MODULE_OPTIONS[name](with_module)
        return with_module

    return decorate


def tolerance_options(default: str = "the float32 model row"):
    """The tolerance group, received by the command as one `tolerance` (a
    tconform.request.Tolerances).
    NaN, infinity and negative values are usage errors (exit 2) by type."""

    def decorate(command):
        @functools.wraps(command)
        def with_tolerance(*args, atol, rtol, per_output, **kwargs):
            from tconform.request import Tolerances

            tolerance = Tolerances(atol, rtol, tuple(per_output))
            return command(*args, tolerance=tolerance, **kwargs)

        for decl in reversed(
            (
                click.option(
                    "--atol", type=ToleranceValue(), help=f"Absolute tolerance [{default}]."
                ),
                click.option(
                    "--rtol", type=ToleranceValue(), help=f"Relative tolerance [{default}]."
                ),
                click.option(
                    "--tolerance",
                    "per_output",
                    multiple=True,
                    type=OutputTolerance(),
                    help="Tolerance for one output (repeatable).",
                ),
            )
        ):
            with_tolerance = decl(with_tolerance)
        return with_tolerance

    return decorate


def quiet_option():
    return click.option("-q", "--quiet", is_flag=True, help="No progress lines.")


def generation_golden_option():
    return folder_option(
        "--golden-generation",
        "golden_generation_dir",
        Path("golden-generation"),
        "Generation goldens (with --generation).",
    )


def shard_option():
    return click.option(
        "--shard",
        type=ShardType(),
        help="Check only shard K of N of the run's work units (CI machines: every unit lands "
        "in exactly one shard; merge the reports with `tconform report merge`).",
    )


# --- the matrix axes -------------------------------------------------------------------------


def _providers():
    import tconform.runtimes.providers

    return tconform.runtimes.providers


# tconform.request.Axes field -> its comma-list type (the pytest plugin converts with them too)
MATRIX_AXES = {
    "exporters": CommaList(lambda: (*EXPORTERS, "auto")),
    "opsets": CommaList(lambda: OPSETS, int),
    "dtypes": CommaList(lambda: [*MODEL_DTYPES, *PLANNED_DTYPES]),
    "graph_opts": CommaList(lambda: list(_providers().GRAPH_OPT_LEVELS)),
}
# option -> (Axes field, what the axis is)
AXIS_OPTIONS = {
    "--exporter": ("exporters", "exporters"),
    "--opset": ("opsets", "ONNX opsets"),
    "--dtype": ("dtypes", "model dtypes"),
    "--graph-opts": ("graph_opts", "ONNX Runtime graph-optimisation levels"),
}


@dataclass(frozen=True)
class AxesChoice:
    """--matrix and the axes as given (an axis not given: None)."""

    matrix: bool = False
    given: tuple[tuple[str, tuple], ...] = ()

    def axes(self, runtime: RuntimeChoice, defaults: dict[str, tuple] | None = None):
        """The request's Axes: the axes given, else `defaults`, else tconform's; one level of
        --graph-opt stands for the graph-optimisation axis where --graph-opts is not given."""
        from tconform.request import Axes

        given = dict(self.given)
        level = runtime.settings.get("graph_opt")
        if "graph_opts" in given and level is not None:
            raise click.UsageError(
                "--graph-opt is one level, --graph-opts the matrix axis: not both"
            )
        values = {**(defaults or {}), **given}
        if level is not None:
            values.setdefault("graph_opts", (level,))
        return Axes(matrix=self.matrix, **values)

    def given_model(self) -> None:
        """With a model given (check --model), which is checked as it is, an axis that says
        how tconform makes a model is refused: its cells would be dropped without a word."""
        for flag, (name, _) in AXIS_OPTIONS.items():
            if name != "graph_opts" and name in dict(self.given):
                raise click.UsageError(
                    f"{flag} chooses how tconform makes a model; --model checks that file as it "
                    "is (--graph-opts still applies)"
                )

    def single(self) -> None:
        """Without --matrix, each axis holds one value (the run's one cell)."""
        if self.matrix:
            return
        for flag, (name, _) in AXIS_OPTIONS.items():
            if len(dict(self.given).get(name, ())) > 1:
                raise click.UsageError(f"{flag} lists several values: add --matrix")


def axes_options(help_default: str, **defaults: str):
    """--matrix and the axes (--exporter, --opset, --dtype, --graph-opts), received by the
    command as one `axes` (an AxesChoice); each axis's help shows `help_default` with the
    axis's own default (`defaults`, by Axes field) in place of {}."""

    def decorate(command):
        @functools.wraps(command)
        def with_axes(*args, **kwargs):
            matrix = kwargs.pop("matrix")
            values = {
                name: _joined(flag, kwargs.pop(name)) for flag, (name, _) in AXIS_OPTIONS.items()
            }
            given = tuple((name, value) for name, value in values.items() if value)
            return command(*args, axes=AxesChoice(matrix, given), **kwargs)

        for flag, (name, what) in reversed(AXIS_OPTIONS.items()):
            with_axes = click.option(
                flag,
                name,
                type=MATRIX_AXES[name],
                multiple=True,
                help=f"Axis: {what}, a comma list, or the option repeated "
                f"[{help_default.format(defaults[name])}].",
            )(with_axes)
        return click.option(
            "--matrix",
            is_flag=True,
            help="Check every cell of the axes (exporter x opset x dtype x graph-optimisation "
            "level), each export once, with a pivot of cases x cells; impossible cells are "
            "listed as not applicable, with the reason.",
        )(with_axes)

    return decorate


def _joined(flag: str, lists: tuple[tuple, ...]) -> tuple:
    """An axis given several times (--dtype float16 --dtype float32) holds every value given,
    each once: the last one alone would drop the others without a word."""
    values = tuple(value for given in lists for value in given)
    for n, value in enumerate(values):
        if value in values[:n]:
            raise click.UsageError(f"{flag}: {value!r} given twice")
    return values


def localise_option(default: str, help_default: str):
    """--localise [never|failure|always] (alone: failure), received as `localise`."""
    return click.option(
        "--localise",
        "--localize",
        "localise",
        type=click.Choice(["never", "failure", "always"]),
        is_flag=False,
        flag_value="failure",
        default=default,
        show_default=True,
        help="Name the first submodule whose output leaves tolerance (docs/check.md): on a "
        "failing result (--localise alone), always (a passing run too: a module whose error "
        f"the outputs absorb is named, the verdict unchanged), or never [{help_default}].",
    )
