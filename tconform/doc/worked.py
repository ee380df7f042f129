"""The documents' worked numbers as cases: every entry of the documents' tables, judged.

The numbers the documents state are data (tconform/doc/data/, one table per document). Here each
entry becomes one case with the same id: its exact value is computed, by the float64 oracle or,
for shapes, by the reference modules, and the printed value is judged against it (verdict.py).
`document_cases()` evaluates every case.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from tconform import oracle, reference, registry
from tconform.config import PRESETS, ModelConfig
from tconform.doc import properties, verdict
from tconform.doc.data import ENTRIES, Entry, PeTerm, doc000, doc001, doc002, paper
from tconform.export import ExportSettings, build_module

WAVELENGTH_D_MODEL = 512  # doc 004 states no width; any d gives the same range, we take 512
NORM_SAMPLE_SEED = 0  # a sample input for the LayerNorm listings: 4 rows of width 512


@dataclass(frozen=True)
class RuntimeCheck:
    """Run the exported `case` at `cfg` on `feeds` and compare output `output` with `exact`."""

    case: str
    cfg: ModelConfig
    config_name: str  # the artifacts subfolder: artifacts/doc/<config_name>/
    feeds: dict[str, np.ndarray]
    output: int
    exact: np.ndarray


@dataclass(kw_only=True)
class DocCase:
    id: str
    source: str
    section: str
    quantity: str
    printed: np.ndarray  # float values (from the printed strings, or of written expressions)
    exact: np.ndarray
    decimals: int | list | None  # digits after the point per printed number; None: exact form
    verdict: str
    worst_deviation: float
    note: str = ""
    runtime: RuntimeCheck | None = None
    corrected: list = field(default_factory=list)  # [index, printed, exact] where off

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "source": self.source,
            "section": self.section,
            "quantity": self.quantity,
            "printed": self.printed.tolist(),
            "exact": self.exact.tolist(),
            "decimals": self.decimals,
            "verdict": self.verdict,
            "worst_deviation": self.worst_deviation,
            "corrected": self.corrected,
            "note": self.note,
        }


def entry_case(entry: Entry, **judged) -> DocCase:
    """The case of `entry`: its citation, quantity and decimals from the table, the rest
    (printed, exact, verdict, worst_deviation, note, runtime, corrected) as judged."""
    return DocCase(
        id=entry.id,
        source=entry.source,
        section=entry.section,
        quantity=entry.quantity,
        decimals=entry.decimals,
        **judged,
    )


def written_value(term: PeTerm) -> float:
    """A PE entry evaluated as doc 000 writes it."""
    angle = term.pos / doc000.PE_BASE ** (term.numerator / term.denominator)
    return math.sin(angle) if term.fn == "sin" else math.cos(angle)


def printed_values(entry: Entry) -> np.ndarray:
    """An entry's printed numbers as float64: decimals as printed, exact forms as written."""
    if entry.decimals is not None:
        return verdict.as_numbers(np.array(entry.printed, dtype=object))
    values = [written_value(v) if isinstance(v, PeTerm) else v for v in entry.printed]
    return np.array(values, dtype=np.float64)


def _off_list(printed: np.ndarray, exact: np.ndarray, off: np.ndarray) -> list:
    """[index, printed, exact] for every printed number judged wrong."""
    printed, exact, off = np.atleast_1d(printed), np.atleast_1d(exact), np.atleast_1d(off)
    return [
        [[int(j) for j in i], float(printed[i]), float(exact[i])]
        for i in zip(*off.nonzero(), strict=True)
    ]


def printed_case(
    entry: Entry, exact: np.ndarray, note: str = "", runtime: RuntimeCheck | None = None
) -> DocCase:
    """A case whose document prints rounded decimals: judged within one unit of the last digit."""
    exact = np.asarray(exact, dtype=np.float64)
    judgement = verdict.judge_printed(np.array(entry.printed, dtype=object), exact)
    return _judged_case(entry, printed_values(entry), exact, judgement, note, runtime)


def expression_case(
    entry: Entry, exact: np.ndarray, note: str, runtime: RuntimeCheck | None = None
) -> DocCase:
    """A case whose document writes exact forms: judged to float64 evaluation noise."""
    written = printed_values(entry)
    judgement = verdict.judge_expressions(written, exact)
    return _judged_case(entry, written, exact, judgement, note, runtime)


def _judged_case(
    entry: Entry, written, exact: np.ndarray, judgement, note: str, runtime: RuntimeCheck | None
) -> DocCase:
    ruling, worst, off = judgement
    return entry_case(
        entry,
        printed=written,
        exact=exact,
        verdict=ruling,
        worst_deviation=worst,
        note=note,
        runtime=runtime,
        corrected=_off_list(written, exact, off),
    )


# --- the attention example ---------------------------------------------------------------


def _attention_000() -> dict[str, np.ndarray]:
    x = np.array(doc000.X)
    q, k, v = x @ np.array(doc000.W_Q), x @ np.array(doc000.W_K), x @ np.array(doc000.W_V)
    context, weights = oracle.scaled_dot_product_attention(q, k, v)
    scores = q @ k.T
    return {
        "Q": q,
        "K": k,
        "V": v,
        "QK^T": scores,
        "S": scores / math.sqrt(doc000.D_K),
        "weights": weights,
        "context": context,
    }


ATTENTION_CONFIG = PRESETS["tiny"].replace(d_model=2, n_heads=1, max_seq_len=3)


def _attention_runtime(output: int, exact: np.ndarray) -> RuntimeCheck:
    exact_qkv = _attention_000()
    feeds = {
        name: exact_qkv[name.upper()].astype(np.float32)[None, None] for name in ("q", "k", "v")
    }
    feeds["mask"] = np.ones((1, 1, 3, 3), dtype=bool)
    return RuntimeCheck(
        "attention", ATTENTION_CONFIG, "attention-d2", feeds, output, exact[None, None]
    )


def attention_cases() -> list[DocCase]:
    exact = _attention_000()
    printed_scores = printed_values(ENTRIES["000-attention-scores"])
    printed_s = printed_values(ENTRIES["000-attention-scaled-scores"])
    # Where do the printed S and the printed weights come from: the printed or the true scores?
    s_follows_printed = np.allclose(printed_s, printed_scores / math.sqrt(doc000.D_K), atol=0.01)
    weights_from_printed = oracle.softmax(printed_s)
    weights_follow_exact = np.allclose(
        printed_values(ENTRIES["000-attention-weights"]), exact["weights"], atol=1e-4, rtol=1e-3
    )
    s_gap = float(np.abs(printed_s - printed_scores / math.sqrt(doc000.D_K)).max())
    weights_origin = (
        "follow from the correct scores (PyTorch computed them)"
        if weights_follow_exact
        else "do not follow from the correct scores"
    )
    from_printed = [f"{w:.4e}" for w in weights_from_printed[0]]
    source_note = (
        f"printed S {'is' if s_follows_printed else 'is roughly'} the printed QK^T / sqrt(2) "
        f"(off by up to {s_gap:.3f}); the printed weights and context vectors {weights_origin}; "
        f"softmax of the printed S would give row 1 = {from_printed}"
    )
    return [
        printed_case(ENTRIES["000-attention-q"], exact["Q"]),
        printed_case(ENTRIES["000-attention-k"], exact["K"]),
        printed_case(ENTRIES["000-attention-v"], exact["V"]),
        printed_case(ENTRIES["000-attention-scores"], exact["QK^T"], note=source_note),
        printed_case(ENTRIES["000-attention-scaled-scores"], exact["S"], note=source_note),
        printed_case(
            ENTRIES["000-attention-weights"],
            exact["weights"],
            note=source_note,
            runtime=_attention_runtime(1, exact["weights"]),
        ),
        printed_case(
            ENTRIES["000-attention-context"],
            exact["context"],
            note=source_note,
            runtime=_attention_runtime(0, exact["context"]),
        ),
    ]


# --- positional encodings ------------------------------------------------------------------


def pe_config(d_model: int, base: float, length: int, formula: str = "formula") -> ModelConfig:
    return PRESETS["tiny"].replace(
        d_model=d_model, n_heads=1, pe_base=base, max_seq_len=length, pe_formula=formula
    )


def _pe_runtime(d_model: int, base: float, x: np.ndarray, exact: np.ndarray) -> RuntimeCheck:
    length = x.shape[0]
    cfg = pe_config(d_model, base, length)
    name = f"pe-d{d_model}-base{base:g}-len{length}"
    feeds = {"x": x.astype(np.float32)[None]}
    return RuntimeCheck("positional_encoding", cfg, name, feeds, 0, exact[None])


def pe_expression_cases() -> list[DocCase]:
    """Doc 000 writes each PE entry as an expression; some use d_model = 8 instead of 512."""
    d_model = doc000.PE_D_MODEL
    table = oracle.sinusoid_table(3, d_model, base=doc000.PE_BASE)
    runtime = _pe_runtime(d_model, doc000.PE_BASE, np.zeros((3, d_model)), table)
    cases = []
    for entry in (ENTRIES[f"000-pe-pos{pos}"] for pos in range(3)):
        terms = entry.printed
        exact = np.array([table[t.pos, t.column] for t in terms])
        # The formula's exponent for column c is 2i/d_model with 2i = c rounded down to even.
        wrong = [
            f"{t.fn}({t.pos}/10000^({t.numerator}/{t.denominator}))"
            for t in terms
            if t.numerator / t.denominator != (t.column - t.column % 2) / d_model
        ]
        case = expression_case(entry, exact, note="", runtime=runtime)
        holds_anyway = (
            "; at pos 0 every exponent gives the same value, so the numbers hold"
            if not case.corrected
            else ""
        )
        case.note = (
            f"written with d_model=8 instead of {d_model}: {', '.join(wrong)}{holds_anyway}"
            if wrong
            else f"expressions match the formula at d_model={d_model}"
        )
        cases.append(case)
    return cases


def pe_table_cases() -> list[DocCase]:
    x = np.array(doc001.X)
    seq, d_model = x.shape
    x_pe = oracle.positional_encoding({}, pe_config(d_model, doc001.PE_BASE, seq), x)
    code_table = oracle.sinusoid_table(seq, d_model, base=doc001.CODE_BASE)
    x_pe_case = printed_case(
        ENTRIES["001-pe-x-pe"], x_pe, runtime=_pe_runtime(d_model, doc001.PE_BASE, x, x_pe)
    )
    if x_pe_case.corrected:  # say what the wrong entries were computed with, if base 100 fits
        with_code_base = x + code_table
        fits = [abs(with_code_base[tuple(i)] - p) <= 1e-3 for i, p, _ in x_pe_case.corrected]
        if all(fits):
            x_pe_case.note = (
                f"the wrong entries equal x + PE with base {doc001.CODE_BASE:g}, "
                "the base of the code below"
            )
    return [
        x_pe_case,
        printed_case(
            ENTRIES["001-pe-code-n100"],
            code_table,
            runtime=_pe_runtime(d_model, doc001.CODE_BASE, np.zeros_like(x), code_table),
        ),
    ]


def wavelength_case() -> DocCase:
    """Doc 004: wavelengths from 2π to 10000·2π, read off the oracle's table at d=512.

    At pos = 1 each pair holds (sin ω_i, cos ω_i) with ω_i <= 1, so atan2 recovers ω_i exactly.
    The progression 2π·10000^(2i/d) runs over i < d/2, so its last term is one ratio short of
    10000·2π: the text's upper end is the progression's limit, which we take as what it states.
    """
    d_model = WAVELENGTH_D_MODEL
    table = oracle.sinusoid_table(2, d_model)
    omega = np.arctan2(table[1, 0::2], table[1, 1::2])
    wavelengths = 2 * math.pi / omega
    ratio = wavelengths[1] / wavelengths[0]
    exact = np.array([wavelengths[0], wavelengths[-1] * ratio])
    is_geometric = np.allclose(wavelengths[1:] / wavelengths[:-1], ratio, rtol=1e-9)
    note = (
        f"geometric: {is_geometric}, ratio 10000^(2/{d_model}) = {ratio:.6f}; longest present "
        f"wavelength {wavelengths[-1]:.1f} = 2π·10000^({d_model - 2}/{d_model}), the next "
        "term would be 10000·2π"
    )
    case = expression_case(ENTRIES["004-pe-wavelengths"], exact, note)
    if not is_geometric:
        case.verdict = verdict.ERRATUM
    return case


# --- the dictionary example and doc 002's shapes -------------------------------------------


def dictionary_case() -> DocCase:
    exact = np.array(doc001.DICTIONARY_WEIGHTS) @ np.array(doc001.DICTIONARY_VALUES)
    return printed_case(ENTRIES["001-dictionary-lookup"], np.array(exact))


def _module_output_shapes() -> dict[str, list[int]]:
    """Doc 002's modules (our reference at doc 002's config) on its input, by entry id."""
    cfg = PRESETS["doc002"].replace(n_heads=doc002.SHAPE_HEADS, n_layers=1)
    x = torch.zeros(doc002.SHAPE_BATCH, doc002.SHAPE_SEQ, cfg.d_model)
    keep = torch.ones(doc002.SHAPE_BATCH, doc002.SHAPE_SEQ, dtype=torch.bool)
    modules: dict[str, Callable[[], torch.Tensor]] = {
        "002-shape-positionalencoder": lambda: reference.PositionalEncoding(cfg)(x),
        "002-shape-multiheadattention": lambda: reference.MultiHeadAttention(cfg)(x, x, keep),
        "002-shape-feedforward": lambda: reference.FeedForward(cfg)(x),
    }
    with torch.inference_mode():
        return {entry_id: list(run().shape) for entry_id, run in modules.items()}


def shape_cases() -> list[DocCase]:
    return [
        printed_case(ENTRIES[entry_id], np.array(shape, dtype=np.float64))
        for entry_id, shape in _module_output_shapes().items()
    ]


def module_tree_case() -> DocCase:
    """The same sizes read off our reference model at doc 002's preset (built on the meta
    device: shapes without memory). torch stores Linear weights as (out, in)."""
    with torch.device("meta"):
        model = reference.Transformer(PRESETS["doc002"])
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    layer = "encoder.layers.0."
    in_out = lambda name: list(reversed(shapes[name]))  # noqa: E731
    exact = [
        *shapes["src_embed.table"],
        *shapes["tgt_embed.table"],
        len(model.encoder.layers),
        len(model.decoder.layers),
        *in_out(layer + "self_attn.w_q.weight"),
        *in_out(layer + "ffn.w1.weight"),
        *in_out(layer + "ffn.w2.weight"),
        *in_out("head.proj.weight"),
    ]
    return printed_case(ENTRIES["002-module-tree"], np.array(exact, dtype=np.float64))


# --- statements about the architecture -----------------------------------------------------


def masked_sublayer_case() -> DocCase:
    """Doc 004's decoder section says the *encoder's* first sublayer is the masked one.

    Measured on the oracle at the tiny preset: the encoder layer's self-attention lets later
    positions reach earlier ones; the decoder's masked self-attention does not.
    """
    cfg = PRESETS["tiny"]
    table = np.random.default_rng(1).normal(size=(cfg.src_vocab, cfg.d_model))  # token vectors
    ids = np.random.default_rng(2).integers(0, cfg.src_vocab, (2, 6))
    keep = np.ones(ids.shape, dtype=bool)

    def params(case: str) -> dict[str, np.ndarray]:
        return build_module(registry.get_case(case), ExportSettings(cfg))[1]

    enc, causal = params("encoder_layer"), oracle.scope(params("mha_causal"), "attn")

    def encoder_layer(tokens: np.ndarray) -> np.ndarray:
        return oracle.encoder_layer(enc, cfg, table[tokens], keep)

    def masked_self_attention(tokens: np.ndarray) -> np.ndarray:
        x = table[tokens]
        return oracle.multi_head_attention(causal, cfg, x, x, keep, causal=True)

    encoder_leak = properties.causal_violation(encoder_layer, ids, cfg.src_vocab)
    decoder_leak = properties.causal_violation(masked_self_attention, ids, cfg.src_vocab)
    masked = float(encoder_leak <= properties.LIMITS["float64"])
    note = (
        "the sentence means the decoder: later inputs move the encoder layer's earlier outputs "
        f"by up to {encoder_leak:.3g} (unmasked); the decoder's masked self-attention by "
        f"{decoder_leak:.3g}"
    )
    # The statement is a yes/no: it holds or it is an erratum, judged exactly.
    return expression_case(ENTRIES["004-masked-sublayer"], np.array([masked]), note)


# --- code listings against their formulas --------------------------------------------------


def _deviation_case(
    entry: Entry,
    listing: np.ndarray,
    formula: np.ndarray,
    note: str,
    runtime: RuntimeCheck | None = None,
) -> DocCase:
    """printed = the listing's value where it is furthest from the formula, exact = formula's.
    `runtime` runs the listing's variant as exported (it must reproduce the listing)."""
    deviation = np.abs(listing - formula)
    worst_at = np.unravel_index(int(deviation.argmax()), deviation.shape)
    worst = float(deviation[worst_at])
    at = [int(i) for i in worst_at]
    return entry_case(
        entry,
        printed=np.array(listing[worst_at]),
        exact=np.array(formula[worst_at]),
        verdict=verdict.DEVIATES if worst > verdict.EXPRESSION_UNIT else verdict.HOLDS,
        worst_deviation=worst,
        note=f"{note}; worst at index {at}",
        runtime=runtime,
        corrected=[[at, float(listing[worst_at]), float(formula[worst_at])]] if worst else [],
    )


def _std_norm_runtime(x: np.ndarray, eps: float) -> RuntimeCheck:
    """The exported `norm` component in its std variant (seeded gain and shift) on x."""
    cfg = pe_config(512, 10000.0, x.shape[0]).replace(norm="std", norm_eps=eps)
    _, params = build_module(registry.get_case("norm"), ExportSettings(cfg))
    exact = oracle.norm(params, cfg, x)
    feeds = {"x": x.astype(np.float32)[None]}
    return RuntimeCheck("norm", cfg, "norm-std-d512", feeds, 0, exact[None])


def listing_cases() -> list[DocCase]:
    length = doc002.PE_LISTING_LENGTH
    listing = oracle.sinusoid_table(length, 512, formula="doc002_listing")
    formula = oracle.sinusoid_table(length, 512)
    x = np.random.default_rng(NORM_SAMPLE_SEED).normal(size=(4, 512))
    unit = {"gain": np.ones(512), "shift": np.zeros(512)}

    def norm(kind: str, eps: float) -> np.ndarray:
        return oracle.norm(unit, PRESETS["base"].replace(norm=kind, norm_eps=eps), x)

    # Both listings are the same variant (unbiased std, eps added to it), exported once at
    # doc 002's eps; doc 001's listing writes the same eps.
    std_norm_runtime = _std_norm_runtime(x, doc002.NORM_LAYER_EPS)
    return [
        _deviation_case(
            ENTRIES["002-pe-listing"],
            listing,
            formula,
            "the loop's i is already the even column j, yet it writes 2*i into the exponent: "
            "sin column j gets 10000^(-2j/d) (formula: 10000^(-j/d)) and cos column j+1 gets "
            "10000^(-2(j+1)/d) (formula: 10000^(-j/d)); only column 0 agrees",
            RuntimeCheck(
                "positional_encoding",
                pe_config(512, 10000.0, length, "doc002_listing"),
                f"pe-d512-len{length}-doc002-listing",
                {"x": np.zeros((1, length, 512), dtype=np.float32)},
                0,
                listing[None],
            ),
        ),
        _deviation_case(
            ENTRIES["001-layernorm-listing"],
            norm("std", doc001.LAYERNORM_EPS),
            norm("layernorm", doc001.LAYERNORM_EPS),  # gamma (x - mu) / sqrt(var + eps) + beta
            "sample input: 4 standard-normal rows of width 512, gain 1, shift 0, eps 1e-6",
            std_norm_runtime,
        ),
        _deviation_case(
            ENTRIES["002-layernorm-listing"],
            norm("std", doc002.NORM_LAYER_EPS),
            norm("layernorm", 0.0),  # alpha (x - mu) / sigma + beta
            "sample input as above; the section also calls sigma the variance (方差) where the "
            "formula needs the standard deviation",
            std_norm_runtime,
        ),
    ]


def paper_parameter_case() -> DocCase:
    """Table 3 of the paper, counted on our reference with one shared 37000 x d_model matrix
    for source embedding, target embedding and pre-softmax projection (as the paper does)."""
    entry = ENTRIES["paper-table3-params"]
    printed = printed_values(entry)
    names = [name for name, _, _ in paper.TABLE_3]
    counts = properties.paper_counts(shared_embedding=True)
    exact = np.array([counts[name] / 1e6 for name in names])
    relative = np.array(list(properties.paper_count_violations(counts).values()))
    off = relative > properties.PAPER_COUNT_TOLERANCE
    note = f"rows: {', '.join(names)}; shared {paper.VOCAB}-token embedding counted once"
    if off.any():
        outside = [f"{n} {r:.1%}" for n, r, o in zip(names, relative, off, strict=True) if o]
        note += f"; outside 5%: {', '.join(outside)}"
    return entry_case(
        entry,
        printed=printed,
        exact=exact,
        verdict=verdict.DIFFERS if off.any() else verdict.HOLDS,
        worst_deviation=float(np.abs(exact - printed).max()),
        note=note,
        corrected=_off_list(printed, exact, off),
    )


def document_cases() -> list[DocCase]:
    """Every worked number and listing finding, evaluated and judged, in document order."""
    return list(_evaluated_cases())


@functools.cache
def _evaluated_cases() -> tuple[DocCase, ...]:
    # Evaluated once per process: the parameter counts build ten models on the meta device.
    return (
        *attention_cases(),
        *pe_expression_cases(),
        dictionary_case(),
        *pe_table_cases(),
        *listing_cases(),
        *shape_cases(),
        module_tree_case(),
        wavelength_case(),
        masked_sublayer_case(),
        paper_parameter_case(),
    )
