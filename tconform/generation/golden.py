"""Generation goldens: the oracle's decoded sequences, in the ONNX test-data layout.

    golden-generation/manifest.json                       config, seed, checkpoint (name and
                                                          sha256), per case its decoding
                                                          settings, tensor shapes and sha256
    golden-generation/<set>-<strategy>/test_data_set_0/   input_K.pb: src_ids, src_keep,
                                                          prefix_ids, prefix_keep
                                                          output_K.pb: tokens, lengths,
                                                          log_probs (each step's distribution)

The oracle decodes with the weights of the committed trained checkpoint CHECKPOINT (trained to
reverse its source; tconform.weights), not seeded random ones: its top-1 margins are wide, so a
token a runtime flips is a real error, not a near-tie. The exported step models hold the same
weights (ExportSettings.checkpoint), and the manifest records the checkpoint's sha256.

The source sets (tiny preset, the checkpoint's): right padding, left padding, sequences ending at
different steps with one, a source of the longest length, cut at the length limit, and the edge
cases: left-padded prompts under the causal mask (a fully masked attention row) for both mask
fills, whose prompts are the start of the model's own answer. Every set starts from an empty
cache (past length 0). The end token is the one the model was trained to end with (EOS); each
set's rule (rows ending at different steps, a row at the limit, ...) is checked on the oracle's
greedy decoding when the goldens are made, and a checkpoint that breaks one is refused.

Files, the writer (write_folder), the tensor reader, atomic replacement and the drift check are
tconform.golden's; log-probs are stored in float32 and checked within one float32 ulp, tokens
and lengths exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np

from tconform import golden as golden_files
from tconform.config import ModelConfig, get_preset
from tconform.errors import EXIT_FAILURE, UsageError
from tconform.files import require_inside
from tconform.folders import GOLDEN, MANIFEST, read_json_manifest
from tconform.generation.driver import (
    BOS,
    EOS,
    PAD,
    Decoding,
    Generation,
    Strategy,
    check_request,
    generate,
)
from tconform.generation.steppers import CachedStepper, oracle_sessions
from tconform.golden import Drift, InputSet
from tconform.reference import Transformer
from tconform.schema import (
    SHA256,
    check_header,
    config_of,
    expect_int,
    expect_object,
    expect_str,
    fail,
)
from tconform.versions import library_versions, tool_version
from tconform.weights import available, checkpoint_params, read_record, same_weights_config

INPUTS = ("src_ids", "src_keep", "prefix_ids", "prefix_keep")
OUTPUTS = ("tokens", "lengths", "log_probs")

STRATEGIES = (
    Strategy("greedy"),
    Strategy("beam", beam_width=3, length_penalty=0.6),
    Strategy("sample", top_k=5, seed=7),
    Strategy("sample", top_p=0.9, seed=11),
)


# The trained checkpoint whose weights the goldens decode with (tconform/data/checkpoints).
CHECKPOINT = "reverse"


@dataclass(frozen=True)
class SourceSet:
    name: str
    padding: str  # right | left: where the source's padding goes
    max_new_tokens: int
    prompt: bool = False  # left-padded prompts: a fully masked row under the causal mask
    mask_fill: str | None = None  # None: the preset's own
    needs_limit: bool = False  # one row must be cut at the length limit, before its end token
    strategies: tuple[Strategy, ...] = STRATEGIES
    lengths: tuple[int, ...] = (4, 7, 2)  # real tokens of each source
    distinct: bool = True  # the greedy rows must end at different steps


SETS = (
    SourceSet("right_padding", "right", 8),
    # The checkpoint saw right-padded sources only: left-padded ones are outside what it learned,
    # so their rows need not end at different steps (they end, or run to the limit).
    SourceSet("left_padding", "left", 8, distinct=False),
    # A source of the longest length the preset holds (its answer and the end token fill the
    # prefix), cut at a limit below its answer's length while the short rows end.
    SourceSet("ends", "right", 9, needs_limit=True, lengths=(4, 10, 2)),
    SourceSet("prompt_left_padding_inf", "right", 7, True, "-inf", strategies=STRATEGIES[:2]),
    SourceSet("prompt_left_padding_1e9", "right", 7, True, "-1e9", strategies=STRATEGIES[:2]),
)


def set_config(cfg: ModelConfig, source_set: SourceSet) -> ModelConfig:
    return cfg.replace(mask_fill=source_set.mask_fill) if source_set.mask_fill else cfg


def checkpoint_record(name: str = CHECKPOINT) -> dict[str, str]:
    """What the manifest records of the checkpoint: its name and the sha256 of its weights."""
    return {"name": name, "sha256": read_record(name)["sha256"]}


def golden_params(cfg: ModelConfig, checkpoint: str = CHECKPOINT):
    """The checkpoint's weights for the Transformer of `cfg` (which must be the checkpoint's
    config, its mask fill aside): the oracle's, and the ones the exported models hold."""
    trained = ModelConfig.from_dict(read_record(checkpoint)["config"])
    if not same_weights_config(trained, cfg):
        raise UsageError(
            f"the generation goldens decode with the trained checkpoint {checkpoint!r}, whose "
            f"config is the {read_record(checkpoint).get('preset', 'recorded')} preset's; this "
            "preset's differs"
        )
    return checkpoint_params(Transformer(cfg), checkpoint, cfg)


def sources(source_set: SourceSet, cfg: ModelConfig, seed: int, params) -> dict[str, np.ndarray]:
    """src_ids, src_keep, prefix_ids, prefix_keep of a set: 3 sequences with the set's numbers
    of real source tokens (symbols, ids 3 and up; padding on the set's side). Prompts are
    left-padded to 3 tokens, [pad pad BOS], [pad BOS w], [BOS w w], the words w the first
    tokens of the oracle's greedy answer to the source (its own answer begun)."""
    rng = np.random.default_rng([seed, sum(map(ord, source_set.name))])
    lengths = source_set.lengths
    seq = min(max(lengths), cfg.max_seq_len)
    src_keep = np.zeros((len(lengths), seq), dtype=bool)
    for row, length in enumerate(lengths):
        if source_set.padding == "right":
            src_keep[row, :length] = True
        else:
            src_keep[row, seq - length :] = True
    src_ids = np.where(src_keep, rng.integers(3, cfg.src_vocab, src_keep.shape), PAD)
    inputs = {"src_ids": src_ids.astype(np.int64), "src_keep": src_keep}
    prefix_ids = np.full((len(lengths), 1), BOS, dtype=np.int64)
    prefix_keep = np.ones((len(lengths), 1), dtype=bool)
    if source_set.prompt:
        unprompted = {**inputs, "prefix_ids": prefix_ids, "prefix_keep": prefix_keep}
        answer = oracle_generate(
            cfg, params, unprompted, Decoding(2, eos_id=None), Strategy("greedy")
        ).tokens
        prefix_ids = np.array([[PAD, PAD, BOS], [PAD, BOS, 0], [BOS, 0, 0]], dtype=np.int64)
        prefix_keep = np.array([[0, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=bool)
        after_bos = np.cumsum(prefix_ids == BOS, axis=1) - (prefix_ids == BOS) > 0
        words = np.zeros_like(prefix_ids)
        for row in range(len(words)):
            count = int(after_bos[row].sum())
            words[row, words.shape[1] - count :] = answer[row, :count]
        prefix_ids = np.where(after_bos, words, prefix_ids)
    return {**inputs, "prefix_ids": prefix_ids, "prefix_keep": prefix_keep}


def oracle_generate(
    cfg: ModelConfig, params, inputs: dict[str, np.ndarray], decoding: Decoding, strategy: Strategy
) -> Generation:
    stepper = CachedStepper(oracle_sessions(cfg, params), cfg, np.float64)
    prefix = (inputs["prefix_ids"], inputs["prefix_keep"])
    with np.errstate(invalid="ignore"):  # a fully masked row under a -inf fill is NaN by design
        return generate(stepper, inputs["src_ids"], inputs["src_keep"], decoding, strategy, prefix)


def set_rule_broken(source_set: SourceSet, greedy: Generation) -> str | None:
    """What of the set's rule the oracle's greedy decoding breaks (None: nothing): one row ends
    with the end token at least; rows end at different steps where the set asks it; with
    `needs_limit`, two rows end and one is cut at the limit before its end token."""
    lengths, limit = greedy.lengths, source_set.max_new_tokens
    ended = (greedy.tokens == EOS).any(axis=1)
    if source_set.distinct and not source_set.prompt and len(set(lengths.tolist())) < len(lengths):
        return f"its greedy rows end at the same step (lengths {lengths.tolist()})"
    if ended.sum() < (2 if source_set.needs_limit else 1):
        return f"too few greedy rows end with the end token (lengths {lengths.tolist()})"
    if source_set.needs_limit and not ((lengths == limit) & ~ended).any():
        return f"no greedy row is cut at the limit of {limit} tokens"
    return None


@dataclass(eq=False)  # one object per golden, equal to itself only: a plan's lanes key on it
class GenerationCase:
    name: str  # <set>-<strategy>
    source_set: SourceSet
    strategy: Strategy
    decoding: Decoding
    input_set: InputSet
    # its size, as the plan costs it (tconform.plan.SuiteCase): a whole model, decoded
    tolerance: ClassVar[str] = "model"

    @property
    def component(self) -> str:
        return f"generation, {self.strategy.name}"

    def generation(self) -> Generation:
        out = self.input_set.outputs
        return Generation(out["tokens"], out["lengths"], out["log_probs"].astype(np.float64))


def build_cases(cfg: ModelConfig, seed: int, checkpoint: str = CHECKPOINT) -> list[GenerationCase]:
    """Every set x strategy, computed by the oracle with the checkpoint's weights, in memory;
    a set whose rule the checkpoint's greedy decoding breaks is refused (set_rule_broken)."""
    cases = []
    for source_set in SETS:
        set_cfg = set_config(cfg, source_set)
        params = golden_params(set_cfg, checkpoint)
        inputs = sources(source_set, set_cfg, seed, params)
        decoding = Decoding(source_set.max_new_tokens, eos_id=EOS)
        greedy = oracle_generate(set_cfg, params, inputs, decoding, Strategy("greedy"))
        broken = set_rule_broken(source_set, greedy)
        if broken:
            raise UsageError(f"set {source_set.name}: checkpoint {checkpoint!r}: {broken}")
        for strategy in source_set.strategies:
            result = oracle_generate(set_cfg, params, inputs, decoding, strategy)
            outputs = {
                "tokens": result.tokens,
                "lengths": result.lengths,
                "log_probs": result.log_probs.astype(np.float32),
            }
            input_set = InputSet("test_data_set_0", dict(inputs), outputs)
            name = f"{source_set.name}-{strategy.name}"
            cases.append(GenerationCase(name, source_set, strategy, decoding, input_set))
    return cases


def _stored(case: GenerationCase) -> golden_files.StoredCase:
    tensors = {**case.input_set.inputs, **case.input_set.outputs}
    entry = {
        "set": case.source_set.name,
        "mask_fill": case.source_set.mask_fill,
        "strategy": vars(case.strategy),
        "decoding": vars(case.decoding),
        "shapes": {name: list(array.shape) for name, array in tensors.items()},
    }
    return golden_files.StoredCase(case.name, [case.input_set], entry)


def write(folder: Path, cfg: ModelConfig, seed: int, preset: str, force: bool = False) -> dict:
    """Write the generation goldens into `folder` with tconform.golden's writer (the folder
    replaced whole, with force)."""
    golden_params(cfg)  # the preset must be the checkpoint's: refused before any file is touched
    header = {
        "kind": GOLDEN,
        "generation": True,
        "tool": "tconform",
        "version": tool_version(),
        "preset": preset,
        "config": cfg.to_dict(),
        "seed": seed,
        "checkpoint": checkpoint_record(),
        "stored_dtype": "float32",
        "versions": library_versions(),
    }
    cases = (_stored(case) for case in build_cases(cfg, seed))
    return golden_files.write_folder(folder, header, cases, force)


def read_generation_manifest(folder: Path) -> dict:
    """The generation manifest, its config, seed and checkpoint checked: the checkpoint is one
    tconform holds, looked up by name (a name, never a path), and the config is its own."""
    path = folder / MANIFEST
    if not path.is_file():
        raise UsageError(f"{path}: missing (run `tconform golden --generation` to make it)")
    manifest = read_json_manifest(require_inside(folder, path))
    if manifest.get("kind") != GOLDEN or manifest.get("generation") is not True:
        raise UsageError(f"{path}: not a generation golden manifest")
    if not isinstance(manifest.get("cases"), dict) or not manifest["cases"]:
        raise UsageError(f"{path}: lists no generation cases: nothing to check")
    recorded = manifest.get("checkpoint")
    if not (isinstance(recorded, dict) and set(recorded) == {"name", "sha256"}):
        raise UsageError(
            f"{path}: records no checkpoint (goldens of seeded weights, from before the trained "
            "checkpoint): run `tconform golden --generation --force` to remake them"
        )
    if recorded["name"] not in available():
        raise fail(
            path, "'checkpoint' 'name'", f"is not one of the checkpoints tconform holds "
            f"({', '.join(available())}): a name, never a path"
        )  # fmt: skip
    expect_str(recorded["sha256"], path, "'checkpoint' 'sha256'", SHA256)
    cfg = config_of(manifest, path)
    trained = ModelConfig.from_dict(read_record(recorded["name"])["config"])
    if not same_weights_config(trained, cfg):
        raise fail(
            path, "'config'", f"is not the one checkpoint {recorded['name']!r} was trained at"
        )
    check_header(manifest, path, cfg)
    return manifest


def require_current_checkpoint(folder: Path, recorded: dict[str, str]) -> str:
    """The name of the checkpoint the goldens were decoded with, which must be the committed one
    (the same sha256): models exported now hold its weights. Exit 2 otherwise."""
    current = checkpoint_record(recorded["name"])
    if current != recorded:
        raise UsageError(
            f"{folder / MANIFEST}: decoded with checkpoint {recorded['name']!r} of sha256 "
            f"{recorded['sha256'][:12]}, the committed one is {current['sha256'][:12]}: "
            "remake the goldens (`tconform golden --generation --force`)"
        )
    return recorded["name"]


def named_cases() -> dict[str, tuple[SourceSet, Strategy]]:
    """Every generation golden this tconform writes, by name: <set>-<strategy>."""
    return {f"{s.name}-{t.name}": (s, t) for s in SETS for t in s.strategies}


def read_cases(folder: Path) -> tuple[ModelConfig, int, dict[str, str], list[GenerationCase]]:
    """Config, seed, checkpoint record (name, sha256) and the stored cases, every file checked
    against the manifest's sha256 and shape, and every case's decoding settings and tensors
    against the config (read_case_tensors), all before anything runs."""
    manifest = read_generation_manifest(folder)
    path = folder / MANIFEST
    cfg = ModelConfig.from_dict(manifest["config"])
    by_name = named_cases()
    cases = []
    for name, entry in manifest["cases"].items():
        if name not in by_name:
            raise fail(path, f"case {name!r:.80}", "is not a generation case this tconform knows")
        source_set, strategy = by_name[name]
        where = f"case {name!r}"
        entry = expect_object(entry, path, where)
        for key in ("sha256", "shapes", "decoding"):
            expect_object(entry.get(key), path, f"{where} {key!r}")
        _require_named_settings(entry, source_set, strategy, path, where)
        tensors = {}
        for kind, names in (("input", INPUTS), ("output", OUTPUTS)):
            for k, tensor in enumerate(names):
                rel = f"test_data_set_0/{kind}_{k}.pb"
                shape = entry["shapes"].get(tensor)
                if not isinstance(shape, list):
                    raise fail(path, f"{where} shape of {tensor!r}", "must be a list of sizes")
                for size in shape:
                    expect_int(size, path, f"{where} shape of {tensor!r}", 0, 2**31)
                stored_name, array = golden_files.read_tensor(
                    folder / name / rel,
                    expect_str(entry["sha256"].get(rel), path, f"{where} sha256 of {rel}", SHA256),
                    shape,
                    folder,
                )
                if stored_name != tensor:
                    raise UsageError(
                        f"{folder / name / rel}: holds {stored_name!r}, not {tensor!r}"
                    )
                tensors[tensor] = array
        set_cfg = set_config(cfg, source_set)
        decoding = _decoding(entry["decoding"], path, where)
        try:
            check_request(set_cfg, decoding, strategy, tensors["prefix_ids"].shape[-1])
        except UsageError as exc:
            raise fail(path, where, f"decoding: {exc}") from None
        _check_tensors(folder / name, tensors, set_cfg, decoding)
        input_set = InputSet(
            "test_data_set_0",
            {n: tensors[n] for n in INPUTS},
            {n: tensors[n] for n in OUTPUTS},
        )
        cases.append(GenerationCase(name, source_set, replace(strategy), decoding, input_set))
    return cfg, int(manifest["seed"]), dict(manifest["checkpoint"]), cases


def _require_named_settings(
    entry: dict, source_set: SourceSet, strategy: Strategy, path: Path, where: str
) -> None:
    """A case's set, mask fill and strategy come from its name; the manifest records them for
    the reader, and a recorded value that is not the name's is refused, never run over."""
    named = {"set": source_set.name, "mask_fill": source_set.mask_fill, "strategy": vars(strategy)}
    for key, value in named.items():
        if key in entry and entry[key] != value:  # NaN is never equal: refused too
            raise fail(path, f"{where} {key!r}", f"is {entry[key]!r:.80}, where the case "
                       f"decodes with {value!r}: a case's settings come from its name")  # fmt: skip


def _decoding(settings: dict, path: Path, where: str) -> Decoding:
    """A case's decoding settings: Decoding's fields, each an integer (the end token may be
    null: none); ranges are check_request's."""
    fields = set(vars(Decoding(1)))
    if set(settings) - fields or "max_new_tokens" not in settings:
        raise fail(path, f"{where} 'decoding'", f"must hold {', '.join(sorted(fields))} only")
    for key, number in settings.items():
        if not (type(number) is int or (key == "eos_id" and number is None)):
            raise fail(path, f"{where} decoding {key!r}", f"must be an integer, not {number!r}")
    return Decoding(**settings)


def _check_tensors(where: Path, tensors: dict[str, np.ndarray], cfg: ModelConfig, decoding) -> None:
    """A case's tensors fit one another and the config: ids int64 within their vocabulary,
    keep masks boolean, one batch, sources no longer than the preset's maximum length, and the
    outputs of `decoding.max_new_tokens` steps over the target vocabulary."""
    batch = len(tensors["src_ids"])
    steps = decoding.max_new_tokens
    shapes = {
        "src_ids": (batch, tensors["src_ids"].shape[-1]),
        "src_keep": (batch, tensors["src_ids"].shape[-1]),
        "prefix_ids": (batch, tensors["prefix_ids"].shape[-1]),
        "prefix_keep": (batch, tensors["prefix_ids"].shape[-1]),
        "tokens": (batch, steps),
        "lengths": (batch,),
        "log_probs": (batch, steps, cfg.tgt_vocab),
    }
    types = {"src_keep": np.bool_, "prefix_keep": np.bool_, "log_probs": np.float32}
    for name, array in tensors.items():
        if array.shape != shapes[name] or array.dtype != types.get(name, np.int64):
            raise UsageError(
                f"{where}: {name} is {array.dtype} {list(array.shape)}, where "
                f"{np.dtype(types.get(name, np.int64))} {list(shapes[name])} is expected"
            )
    if not 1 <= tensors["src_ids"].shape[1] <= cfg.max_seq_len:
        raise UsageError(f"{where}: sources of {tensors['src_ids'].shape[1]} tokens, where "
                         f"1..{cfg.max_seq_len} (the preset's maximum length) fit")  # fmt: skip
    bounds = {"src_ids": cfg.src_vocab, "prefix_ids": cfg.tgt_vocab, "tokens": cfg.tgt_vocab,
              "lengths": steps + 1}  # fmt: skip
    for name, high in bounds.items():
        values = tensors[name]
        if values.size and (values.min() < 0 or values.max() >= high):
            bad = int(values.min() if values.min() < 0 else values.max())
            raise UsageError(f"{where}: {name} holds {bad}, outside 0..{high - 1}")


def check(folder: Path) -> list[Drift]:
    """Regenerate in memory and compare: inputs, tokens and lengths exactly, log-probs within
    one float32 ulp (see tconform.golden)."""
    cfg, seed, recorded, stored = read_cases(folder)
    current = checkpoint_record()  # what a regeneration decodes with
    drifts = []
    if current != recorded:
        drifts.append(
            Drift(
                str(folder / MANIFEST),
                f"checkpoint {recorded['name']!r} (sha256 {recorded['sha256'][:12]}) recorded, "
                f"a regeneration decodes with {current['name']!r} "
                f"(sha256 {current['sha256'][:12]})",
            )
        )
    fresh = {case.name: case for case in build_cases(cfg, seed)}
    drifts += [
        Drift(str(folder / name), "missing: a regeneration has this case")
        for name in fresh.keys() - {c.name for c in stored}
    ]
    for case in stored:
        new = fresh.get(case.name)
        where = str(folder / case.name)
        if new is None:
            drifts.append(Drift(where, "a case a regeneration does not have"))
            continue
        if vars(new.decoding) != vars(case.decoding):
            drifts.append(Drift(where, "decoding settings (end token) differ"))
        old_tensors = {**case.input_set.inputs, **case.input_set.outputs}
        for name, array in {**new.input_set.inputs, **new.input_set.outputs}.items():
            old = old_tensors[name]
            if old.shape != array.shape:
                drifts.append(
                    Drift(where, f"{name} shape {list(old.shape)} vs {list(array.shape)}")
                )
            elif name == "log_probs":
                finite = np.isfinite(array) & np.isfinite(old)
                same_nan = np.array_equal(np.isnan(array), np.isnan(old))
                if (
                    not same_nan
                    or golden_files.ulp_distance(old[finite], array[finite]).max(initial=0) > 1
                ):
                    drifts.append(Drift(where, "log_probs differ from a regeneration"))
            elif not np.array_equal(old, array):
                drifts.append(Drift(where, f"{name} differs from a regeneration"))
    return drifts


def run_golden_command(folder: Path, preset: str, seed: int, force: bool, check_only: bool) -> None:
    """`tconform golden --generation [--check]`: write, or check for drift (exit 1)."""
    import click

    if check_only:
        drifts = check(folder)
        for drift in drifts:
            click.echo(f"drift: {drift.path}: {drift.message}")
        click.echo(f"{folder}: {'DRIFT' if drifts else 'matches a regeneration'}")
        if drifts:
            raise SystemExit(EXIT_FAILURE)
        return
    manifest = write(folder, get_preset(preset), seed, preset, force)
    click.echo(f"wrote {len(manifest['cases'])} generation goldens to {folder}")
