"""The one plain-text table renderer every command prints with (verify, doc, check, bench,
bench --compare): columns padded to their widest cell, a rule under the header."""

from __future__ import annotations

from collections.abc import Sequence

from tconform.errors import one_line


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()
) -> str:
    """`right`: indices of columns aligned to the right (numbers). A cell is one line: a name
    holding a newline or a terminal's escape (a file's, a case's) is shown escaped."""
    table = [list(header), *([one_line(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = (
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    return "\n".join([line(table[0]), "  ".join("-" * w for w in widths), *map(line, table[1:])])
