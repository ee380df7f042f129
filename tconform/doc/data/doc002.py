"""002_354943a77c691687.txt: the PE and NormLayer listings, the printed shapes and module tree."""

from tconform.doc.data.entry import Entry

SOURCE = "002_354943a77c691687.txt"

# Each module runs on a (batch, seq_len) = (1, 60) input of width d_model = 512 with heads = 8
# (and d_ff = 2048), then prints the output's torch.Size.
SHAPE_BATCH, SHAPE_SEQ, SHAPE_HEADS = 1, 60, 8
PE_LISTING_LENGTH = 80  # PositionalEncoder(d_model=512, max_seq_len=80)
NORM_LAYER_EPS = 1e-6  # NormLayer(d_model, eps=1e-6)

_SHAPE_EXACT = "the output shape of our reference module at doc 002's config on a zero input"

TABLE = (
    Entry(
        id="002-pe-listing",
        source=SOURCE,
        section="Embedding 嵌入表示层",
        quantity="PositionalEncoder loop vs PE formula, d_model=512, 80 positions",
        printed=None,
        exact="the loop and the formula, both by the oracle's sinusoid table",
    ),
    Entry(
        id="002-layernorm-listing",
        source=SOURCE,
        section="NormLayer 残差连接与层归一化",
        quantity="NormLayer code (unbiased std + eps) vs the section's formula "
        "LN(x) = alpha (x - mu) / sigma + beta",
        printed=None,
        exact="the listing and the formula, both by the oracle, on 4 seeded standard-normal rows",
    ),
    Entry(
        id="002-shape-positionalencoder",
        source=SOURCE,
        section="Embedding 嵌入表示层",
        quantity="PositionalEncoder output shape on a (1, 60, 512) input "
        "(d_model=512, heads=8, d_ff=2048)",
        printed=["1", "60", "512"],
        exact=_SHAPE_EXACT,
    ),
    Entry(
        id="002-shape-multiheadattention",
        source=SOURCE,
        section="Self-Attention 自注意力机制",
        quantity="MultiHeadAttention output shape on a (1, 60, 512) input "
        "(d_model=512, heads=8, d_ff=2048)",
        printed=["1", "60", "512"],
        exact=_SHAPE_EXACT,
    ),
    Entry(
        id="002-shape-feedforward",
        source=SOURCE,
        section="FeedForward 前馈层",
        quantity="FeedForward output shape on a (1, 60, 512) input "
        "(d_model=512, heads=8, d_ff=2048)",
        printed=["1", "60", "512"],
        exact=_SHAPE_EXACT,
    ),
    Entry(
        id="002-module-tree",
        source=SOURCE,
        section="Transformers 结构",
        quantity="sizes in the printed module tree of Transformers(5000, 5000, 512, 32, 64)",
        printed=[
            "5000",  # source embedding (vocab, d_model)
            "512",
            "5000",  # target embedding (vocab, d_model)
            "512",
            "64",  # encoder layers
            "64",  # decoder layers
            "512",  # attention Linear (in, out)
            "512",
            "512",  # FFN linear_1 (in, out)
            "2048",
            "2048",  # FFN linear_2 (in, out)
            "512",
            "512",  # output layer (in, out)
            "5000",
        ],
        exact="parameter shapes of our reference Transformer at the doc002 preset (meta device)",
    ),
)
