"""Suites: where a run's cases come from and what they are judged against (the seam is
tconform.plan.Suite; the pipeline that runs them is tconform.pipeline).

  reference.py   tconform's own cases against the goldens of a golden folder (`verify`)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tconform.plan import Suite
from tconform.request import References, Request


@contextlib.contextmanager
def open_suite(request: Request) -> Iterator[Suite]:
    """The suite of `request`'s subject, open for the block."""
    from tconform.suites.reference import reference_suite

    if isinstance(request.subject, References):
        with reference_suite(request) as suite:
            yield suite
        return
    raise TypeError(f"no suite for {type(request.subject).__name__}")
