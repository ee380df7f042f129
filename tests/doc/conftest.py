"""The components of the document checks, opened once, with exports cached across test sessions."""

from __future__ import annotations

import pytest

from tconform.doc.run import OpenedComponents


@pytest.fixture(scope="session")
def components(request) -> OpenedComponents:
    # pytest's cache folder survives between runs, so the dynamo exports (seconds each) are
    # reused the way `tconform doc` reuses artifacts/doc/.
    return OpenedComponents(request.config.cache.mkdir("tconform-doc-artifacts"))
