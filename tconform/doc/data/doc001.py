"""001_23eb00ff6d84dc18.txt: the dictionary lookup, "I like to code" with PE, the LayerNorm code."""

from tconform.doc.data.entry import Entry

SOURCE = "001_23eb00ff6d84dc18.txt"
PE = "2.3.2 位置编码"

# "2.1.2 深入理解注意力机制": values of apple, banana, chair, and the weights for "fruit".
DICTIONARY_VALUES = [10.0, 5.0, 2.0]
DICTIONARY_WEIGHTS = [0.6, 0.4, 0.0]

# "2.3.2 位置编码": the embeddings of "I like to code", d = 4, base 10000; the section's code
# then runs PositionEncoding(seq_len=4, d_model=4, n=100).
X = [[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.5], [0.3, 0.4, 0.5, 0.6], [0.4, 0.5, 0.6, 0.7]]
PE_BASE = 10000.0
CODE_BASE = 100.0

LAYERNORM_EPS = 1e-6  # "2.2.3 层归一化": the listing's eps=1e-6

TABLE = (
    Entry(
        id="001-dictionary-lookup",
        source=SOURCE,
        section="2.1.2 深入理解注意力机制",
        quantity="0.6*10 + 0.4*5 + 0*2 (attention as a weighted dictionary lookup)",
        printed="8",
        exact="the weights times the values, in float64",
    ),
    Entry(
        id="001-pe-x-pe",
        source=SOURCE,
        section=PE,
        quantity="x_PE = x + PE for 'I like to code', d=4, base 10000",
        printed=[
            ["0.1", "1.2", "0.3", "1.4"],
            ["1.041", "0.84", "0.41", "1.49"],
            ["1.209", "-0.016", "0.52", "1.59"],
            ["0.541", "-0.489", "0.895", "1.655"],
        ],
        exact="the oracle's positional encoding of X at d=4, base 10000",
    ),
    Entry(
        id="001-pe-code-n100",
        source=SOURCE,
        section=PE,
        quantity="printed P of PositionEncoding(4, 4, n=100)",
        printed=[
            ["0.", "1.", "0.", "1."],
            ["0.84147098", "0.54030231", "0.09983342", "0.99500417"],
            ["0.90929743", "-0.41614684", "0.19866933", "0.98006658"],
            ["0.14112001", "-0.9899925", "0.29552021", "0.95533649"],
        ],
        exact="the oracle's sinusoid table, 4 positions, d=4, base 100",
    ),
    Entry(
        id="001-layernorm-listing",
        source=SOURCE,
        section="2.2.3 层归一化",
        quantity="LayerNorm code (unbiased x.std(), eps outside the root) vs the section's formula "
        "(x - mu) / sqrt(sigma^2 + eps), also doc 000's",
        printed=None,
        exact="the listing and the formula, both by the oracle, on 4 seeded standard-normal rows",
    ),
)
