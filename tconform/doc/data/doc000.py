"""000_dfa094e587294adf.txt: the 3-token attention example and the PE expressions of "你好吗"."""

from tconform.doc.data.entry import Entry, PeTerm

SOURCE = "000_dfa094e587294adf.txt"
ATTENTION = "注意力机制（Attention） / Attention计算过程示例"
PE = "位置编码（Positional Encoding）"

# The attention example's inputs: three tokens of width 2 and the three projections.
X = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
W_Q = [[0.5, 0.7], [0.8, 0.9]]
W_K = [[0.3, 0.4], [0.6, 0.5]]
W_V = [[0.2, 0.3], [0.4, 0.5]]
D_K = 2

# The PE example encodes "你好吗" with d_model = 512.
PE_D_MODEL = 512
PE_BASE = 10000.0

_SOFTMAX_EXACT = "softmax of the exact S (the oracle's scaled dot-product attention on Q, K, V)"

TABLE = (
    Entry(
        id="000-attention-q",
        source=SOURCE,
        section=ATTENTION,
        quantity="Q = X W^Q",
        printed=[["2.1", "2.5"], ["4.7", "5.7"], ["7.3", "8.9"]],
        exact="X W^Q in float64",
    ),
    Entry(
        id="000-attention-k",
        source=SOURCE,
        section=ATTENTION,
        quantity="K = X W^K",
        printed=[["1.5", "1.4"], ["3.3", "3.2"], ["5.1", "5.0"]],
        exact="X W^K in float64",
    ),
    Entry(
        id="000-attention-v",
        source=SOURCE,
        section=ATTENTION,
        quantity="V = X W^V",
        printed=[["1.0", "1.3"], ["2.2", "2.9"], ["3.4", "4.5"]],
        exact="X W^V in float64",
    ),
    Entry(
        id="000-attention-scores",
        source=SOURCE,
        section=ATTENTION,
        quantity="Q K^T (before scaling)",
        printed=[["7.7", "16.5", "25.3"], ["17.49", "36.3", "55.11"], ["27.28", "56.1", "84.92"]],
        exact="Q K^T from the exact Q and K",
    ),
    Entry(
        id="000-attention-scaled-scores",
        source=SOURCE,
        section=ATTENTION,
        quantity="S = Q K^T / sqrt(d_k), d_k = 2",
        printed=[
            ["5.44", "11.67", "17.90"],
            ["12.37", "25.69", "39.00"],
            ["19.28", "39.71", "60.11"],
        ],
        exact="the exact Q K^T / sqrt(2)",
    ),
    Entry(
        id="000-attention-weights",
        source=SOURCE,
        section=ATTENTION,
        quantity="softmax(S) printed by PyTorch",
        # printed by PyTorch under the listing (In [1])
        printed=[
            ["8.1903e-06", "2.8578e-03", "9.9713e-01"],
            ["3.1802e-12", "1.7833e-06", "1.0000e+00"],
            ["1.2313e-18", "1.1096e-09", "1.0000e+00"],
        ],
        exact=_SOFTMAX_EXACT,
    ),
    Entry(
        id="000-attention-context",
        source=SOURCE,
        section=ATTENTION,
        quantity="context vectors A V printed by PyTorch",
        printed=[["3.3966", "4.4954"], ["3.4000", "4.5000"], ["3.4000", "4.5000"]],
        exact=f"{_SOFTMAX_EXACT}, times V",
    ),
    Entry(
        id="000-pe-pos0",
        source=SOURCE,
        section=PE,
        quantity="PE entries for 你 (pos 0) as written, vs the formula at d_model=512",
        printed=[
            PeTerm(0, 0, "sin", 0, 8),
            PeTerm(0, 1, "cos", 0, 8),
            PeTerm(0, 2, "sin", 2, 8),
            PeTerm(0, 3, "cos", 2, 8),
        ],
        exact="the oracle's sinusoid table at d_model=512, base 10000",
    ),
    Entry(
        id="000-pe-pos1",
        source=SOURCE,
        section=PE,
        quantity="PE entries for 好 (pos 1) as written, vs the formula at d_model=512",
        printed=[PeTerm(1, 0, "sin", 0, 8), PeTerm(1, 1, "cos", 0, 8), PeTerm(1, 2, "sin", 2, 8)],
        exact="the oracle's sinusoid table at d_model=512, base 10000",
    ),
    Entry(
        id="000-pe-pos2",
        source=SOURCE,
        section=PE,
        quantity="PE entries for 吗 (pos 2) as written, vs the formula at d_model=512",
        printed=[
            PeTerm(2, 0, "sin", 0, 512),
            PeTerm(2, 1, "cos", 0, 512),
            PeTerm(2, 2, "sin", 2, 8),
        ],
        exact="the oracle's sinusoid table at d_model=512, base 10000",
    ),
)
