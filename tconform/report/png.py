"""PNG files tconform writes: each marked as tconform's in a text chunk, so that a later run
may replace it and nothing else (a report path that holds someone's image is refused); a run
that measured nothing still writes one, saying why."""

from __future__ import annotations

import io
import struct
from pathlib import Path

from tconform.files import atomic_write_bytes, printable

SOFTWARE = "tconform"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def save(fig, path: Path, **savefig) -> None:
    """`fig` as a PNG at `path` (atomically), marked as tconform's, and closed. Its texts can
    carry a file name's undecodable byte, which no font draws: escaped first."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_text(printable(text.get_text()))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": SOFTWARE}, **savefig)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def write_message(path: Path, title: str, message: str) -> None:
    """A plot of nothing, saying why: the run stopped before it measured anything."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, textwrap.fill(message, 90), ha="center", va="center", wrap=True)
    save(fig, path, dpi=100)


def is_own(path: Path) -> bool:
    """Whether `path` holds a PNG tconform wrote (marked by `save`), so replacing it loses
    nothing."""
    try:
        with path.open("rb") as png:
            if png.read(8) != PNG_SIGNATURE:
                return False
            for _ in range(64):  # the text chunks come before the image data
                header = png.read(8)
                if len(header) < 8:
                    return False
                length, kind = struct.unpack(">I4s", header)
                if kind in (b"IDAT", b"IEND") or length > 2**16:
                    return False
                body = png.read(length)
                png.read(4)  # the chunk's CRC
                if kind == b"tEXt" and body == b"Software\0" + SOFTWARE.encode():
                    return True
    except OSError:
        return False
    return False
