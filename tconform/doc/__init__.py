"""`tconform doc`: the documents' worked numbers and stated properties as checked cases.

  data/          the numbers the documents state: one table per document, with citations
  worked.py      each table entry as a worked number: the exact value computed, and a verdict
  verdict.py     the verdict rule (within one unit of the last printed digit)
  run.py         feeds the documents' numbers to the components on every requested runtime
  properties.py  the stated properties as violation measures
  checks.py      runs the properties on the oracle and every requested runtime
  report.py      all of it in one run (run_document_checks), as Results (report_results)

Verdicts are facts about the documents; only a runtime disagreeing with the oracle is a failure.
"""

from __future__ import annotations

from tconform.doc.report import (
    DocReport,
    report_results,
    required_exports,
    run_document_checks,
    verify_results,
)

__all__ = [
    "DocReport",
    "report_results",
    "required_exports",
    "run_document_checks",
    "verify_results",
]
