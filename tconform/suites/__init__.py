"""Suites: where a run's cases come from and what they are judged against (the seam is
tconform.plan.Suite; the pipeline that runs them is tconform.pipeline).

  reference.py   tconform's own cases against the goldens of a golden folder (`verify`)
  module.py      a user's model against its own float64 copy (`check`)
  generation.py  tconform's generation goldens, decoded with and without the cache
                 (`verify --generation`)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tconform.errors import UsageError
from tconform.folders import require_caches_apart
from tconform.plan import Progress, Suite, request_runtimes
from tconform.request import Generations, References, Request, UserModel


@contextlib.contextmanager
def open_suite(request: Request, progress: Progress = lambda _: None) -> Iterator[Suite]:
    """The suite of `request`'s subject, open for the block. What is wrong with the caches'
    places or the runtimes' options is said first, before anything is exported or run."""
    subject = request.subject
    own = [subject.out_dir] if isinstance(subject, UserModel) and subject.out_dir else []
    require_caches_apart(own)
    if not request_runtimes(request):
        raise UsageError("nothing to run: no runtime runs on the requested providers")
    if isinstance(request.subject, References):
        from tconform.suites.reference import reference_suite

        with reference_suite(request) as suite:
            yield suite
        return
    if isinstance(request.subject, Generations):
        from tconform.suites.generation import generation_suite

        with generation_suite(request) as suite:
            yield suite
        return
    from tconform.suites.module import module_suite

    with contextlib.ExitStack() as locks:  # its export folder's, from its first export on
        yield module_suite(request, progress, locks)
