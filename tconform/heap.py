"""Freed memory back to the system between the phases of a run on a large model.

A model's weights are freed in pieces of a few MB, below glibc malloc's adaptive mmap
threshold, so they stay in the process's heap after they are freed: the phases of a `check`
(the float64 copy, the model loaded to be checked, ONNX Runtime's session, localisation's
copy) would then each keep what the one before freed, and the process's size would be the sum
of their peaks rather than the largest. `malloc_trim` hands the free pages back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def trim() -> None:
    """Collect garbage and return the C heap's free pages to the system, where the C library
    can (glibc's malloc_trim; elsewhere only the collection)."""
    gc.collect()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
