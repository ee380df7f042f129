"""One runner for the document checks, with exports cached across test sessions."""

from __future__ import annotations

import pytest

from tconform.doc.run import ComponentRunner


@pytest.fixture(scope="session")
def runner(request) -> ComponentRunner:
    # pytest's cache folder survives between runs, so the dynamo exports (seconds each) are
    # reused the way `tconform doc` reuses artifacts/doc/.
    return ComponentRunner(request.config.cache.mkdir("tconform-doc-artifacts"))
