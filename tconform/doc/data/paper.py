""" "Attention Is All You Need" (Vaswani et al., 2017), Table 3: the parameter counts the
documents' architecture is measured against (quoted from outside the five documents)."""

from tconform.doc.data.entry import Entry

SOURCE = "Attention Is All You Need (Vaswani et al., 2017)"

VOCAB = 37000  # the shared source/target BPE vocabulary of the paper's EN-DE model

# Table 3 rows: (name, changes to the base model, parameters in millions as printed).
# Row (C) changes d_model with d_ff kept at 2048: ffn_mult = 2048 / d_model.
TABLE_3 = (
    ("base", {}, "65"),
    ("big", {"d_model": 1024, "n_heads": 16, "ffn_mult": 4}, "213"),
    ("N=2", {"n_layers": 2}, "36"),
    ("N=4", {"n_layers": 4}, "50"),
    ("N=8", {"n_layers": 8}, "80"),
    ("d_model=256", {"d_model": 256, "n_heads": 8, "ffn_mult": 8}, "28"),
    ("d_model=1024", {"d_model": 1024, "n_heads": 8, "ffn_mult": 2}, "168"),
    ("d_ff=1024", {"ffn_mult": 2}, "53"),
    ("d_ff=4096", {"ffn_mult": 8}, "90"),
)

TABLE = (
    Entry(
        id="paper-table3-params",
        source=SOURCE,
        section="Table 3",
        quantity="parameter counts in millions, within 5%",
        printed=[millions for _, _, millions in TABLE_3],
        exact="parameters of our reference Transformer per row (meta device), the shared "
        f"{VOCAB}-token embedding counted once",
    ),
)
