"""One row of a document's table: a number (or set of numbers) the document states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tconform.doc import verdict


class PeTerm(NamedTuple):
    """A PE entry as doc 000 writes it: PE(pos, column) = fn(pos / 10000^(numerator/denominator))"""

    pos: int
    column: int
    fn: str  # "sin" | "cos"
    numerator: int
    denominator: int


@dataclass(frozen=True, kw_only=True)
class Entry:
    """What a document states, where, and how tconform computes the exact value to judge it.

    `printed` is one of
      - the numbers as the document prints them, as strings in the printed layout (nested
        lists for matrices), so that their precision is known: "1.49" is judged to 0.01;
      - exact forms (expressions such as 2π, or PeTerm as written), compared to float64 noise;
      - None where the document prints no number: a code listing, whose own output is compared
        with the formula printed beside it.
    """

    id: str  # the case id in every report: "<document number>-<what>"
    source: str  # the document's file name (or the paper's title)
    section: str  # the section heading as the document writes it
    quantity: str  # what the numbers are
    printed: list | str | None
    exact: str  # how the exact value is computed

    @property
    def decimals(self) -> int | list | None:
        """Digits after the point of each printed decimal (an int when all agree); None for
        exact forms and listings."""
        if self.printed is None:
            return None
        strings = np.array(self.printed, dtype=object)
        if not all(isinstance(s, str) for s in strings.flat):
            return None
        return verdict.decimals(strings)
