import dataclasses
from pathlib import Path

import pytest

from tconform.config import OPTION_SOURCES, ModelConfig

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_variant_option_has_its_source_and_a_readme_row():
    variants = [
        f.name for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING
    ]
    assert set(OPTION_SOURCES) == set(variants)
    section = README.read_text().split("## The reference model and its variant options")[1]
    section = section.split("\n## ")[0]
    missing = [name for name in variants if f"`{name}`" not in section]
    assert not missing, f"README's variant table lacks {missing}"
