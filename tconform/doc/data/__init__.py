"""The numbers the documents state, as data: one table per source document.

Each module holds one document's table (`TABLE`, a tuple of Entry) and the inputs its worked
examples start from; nothing here computes or judges. tconform/doc/worked.py builds one case per
entry (the case id is the entry id), computes the exact value and judges the printed one.

To add a document check:
  1. add an Entry to the document's table (cite the file name and section; numbers as the
     strings the document prints) and any inputs the example starts from;
  2. build its case in cases.py (a builder that takes the entry, computes the exact value with
     the oracle or the reference, and judges it), listed in `document_cases`;
  3. run `python -m pytest tests/doc`: tests/doc/test_data.py fails until every entry is used
     by exactly one case and every case's printed values come from its entry.
"""

from __future__ import annotations

from tconform.doc.data import doc000, doc001, doc002, doc004, paper
from tconform.doc.data.entry import Entry, PeTerm

TABLES: dict[str, tuple[Entry, ...]] = {
    module.SOURCE: module.TABLE for module in (doc000, doc001, doc002, doc004, paper)
}

ENTRIES: dict[str, Entry] = {entry.id: entry for table in TABLES.values() for entry in table}

__all__ = ["ENTRIES", "TABLES", "Entry", "PeTerm"]
