"""004_291930a9279d233c.txt: the PE wavelength range and the decoder section's masked sublayer."""

import math

from tconform.doc.data.entry import Entry

SOURCE = "004_291930a9279d233c.txt"

TABLE = (
    Entry(
        id="004-pe-wavelengths",
        source=SOURCE,
        section="6、位置编码",
        quantity="wavelength range [2π, 10000·2π] of the sinusoid pairs (d_model=512)",
        printed=[2 * math.pi, 10000 * 2 * math.pi],  # 2π and 10000·2π, exact forms
        exact="2π/ω_i read off the oracle's PE table at d_model=512; the upper end is the "
        "progression's limit, one ratio past its last term",
    ),
    Entry(
        id="004-masked-sublayer",
        source=SOURCE,
        section="2、解码器",
        quantity="is the encoder's first sublayer masked? (1 = masked), as the decoder section "
        "states",
        printed=[1.0],  # the statement as a number: the encoder's first sublayer is masked
        exact="1 when later tokens leave the oracle's encoder layer's earlier outputs unchanged",
    ),
)
