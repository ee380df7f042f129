"""The documents' tables (tconform/doc/data/): complete rows, unique ids, one case per entry,
and every case's printed values taken from its entry."""

import dataclasses
import re
from collections import Counter

import numpy as np
import pytest

from tconform.doc import worked
from tconform.doc.data import ENTRIES, TABLES, Entry, PeTerm, paper

pytestmark = pytest.mark.unit

ALL_ENTRIES = [entry for table in TABLES.values() for entry in table]
DOCUMENT_FILE = re.compile(r"(\d{3})_[0-9a-f]{16}\.txt")


@pytest.fixture(scope="module")
def document_cases() -> list[worked.DocCase]:
    return worked.document_cases()


def disagreements(doc_cases: list[worked.DocCase], entries: dict[str, Entry]) -> list[str]:
    """Where the cases and the tables disagree: an entry used by no case or by several, a case
    with no entry, or a case whose citation or printed values are not its entry's."""
    used = Counter(case.id for case in doc_cases)
    found = [f"{id} used by {used[id]} cases" for id in entries if used[id] != 1]
    found += [f"{id} has no entry" for id in used if id not in entries]
    for case in doc_cases:
        entry = entries.get(case.id)
        if entry is None:
            continue
        cited = (case.source, case.section, case.quantity, case.decimals)
        if cited != (entry.source, entry.section, entry.quantity, entry.decimals):
            found.append(f"{case.id} cites other than its entry")
        if entry.printed is None:  # a listing: its printed value is the listing's own output
            continue
        printed = worked.printed_values(entry)
        if printed.shape != case.exact.shape or not np.array_equal(printed, case.printed):
            found.append(f"{case.id} printed values are not its entry's")
    return found


def test_every_entry_has_every_field():
    for entry in ALL_ENTRIES:
        for name in ("id", "source", "section", "quantity", "exact"):
            value = getattr(entry, name)
            assert isinstance(value, str) and value.strip(), (entry.id, name)
        if entry.printed is None:
            assert entry.decimals is None
            continue
        values = np.array(entry.printed, dtype=object)
        assert values.size > 0, entry.id
        if entry.decimals is None:  # exact forms: numbers, or PE entries as written
            for value in entry.printed:
                assert isinstance(value, float) or (
                    isinstance(value, PeTerm) and value.fn in ("sin", "cos")
                ), entry.id
            terms = [(v.pos, v.column) for v in entry.printed if isinstance(v, PeTerm)]
            assert len(terms) == len(set(terms)), entry.id  # no PE entry written twice
        else:  # decimals as printed, each a finite number
            assert all(np.isfinite(float(s)) for s in values.flat), entry.id


def test_each_table_is_one_document_and_its_ids_are_unique():
    for source, table in TABLES.items():
        ids = [entry.id for entry in table]
        assert len(ids) == len(set(ids)), source
        assert all(entry.source == source for entry in table), source
        document = DOCUMENT_FILE.fullmatch(source)
        prefix = f"{document.group(1)}-" if document else "paper-"
        assert all(id.startswith(prefix) for id in ids), source
    rows = [name for name, _, _ in paper.TABLE_3]
    assert len(rows) == len(set(rows))  # the printed counts and the configs share one row list
    assert len(ENTRIES) == len(ALL_ENTRIES)  # no id in two tables


def test_every_entry_is_used_by_exactly_one_case_with_its_printed_values(document_cases):
    assert disagreements(document_cases, ENTRIES) == []


def test_a_dropped_duplicated_or_unused_number_is_caught(document_cases):
    entry = ENTRIES["000-attention-q"]
    dropped = dataclasses.replace(entry, printed=entry.printed[:-1])
    assert disagreements(document_cases, {**ENTRIES, entry.id: dropped}) == [
        "000-attention-q printed values are not its entry's"
    ]
    retyped = dataclasses.replace(entry, printed=[["2.2", "2.5"], *entry.printed[1:]])
    assert disagreements(document_cases, {**ENTRIES, entry.id: retyped}) == [
        "000-attention-q printed values are not its entry's"
    ]
    built_twice = [*document_cases, document_cases[0]]
    assert disagreements(built_twice, ENTRIES) == ["000-attention-q used by 2 cases"]
    unused = dataclasses.replace(entry, id="000-unused")
    assert disagreements(document_cases, {**ENTRIES, unused.id: unused}) == [
        "000-unused used by 0 cases"
    ]
