"""The shapes a user's model is checked at (tconform.module_check.shapes): which axes are free,
and the input sets made from the example's own values."""

from __future__ import annotations

import pytest
import torch

from tconform.module_check.inputs import ModuleInputs
from tconform.module_check.shapes import BATCH, SEQUENCE, batch_axes, infer_axes, variants

pytestmark = pytest.mark.unit


def _inputs(**tensors: torch.Tensor) -> ModuleInputs:
    return ModuleInputs((), tensors, ())


def test_batch_and_sequence_are_inferred_from_ids_and_masks():
    ids = torch.arange(12).reshape(2, 6)
    mask = torch.ones(2, 6, dtype=torch.long)
    hidden = torch.zeros(2, 6, 8)
    axes = infer_axes(_inputs(input_ids=ids, attention_mask=mask, hidden=hidden), {})
    assert axes == {
        "input_ids": {0: BATCH, 1: SEQUENCE},
        "attention_mask": {0: BATCH, 1: SEQUENCE},
        "hidden": {0: BATCH, 1: SEQUENCE},
    }


def test_an_image_gets_a_batch_axis_and_nothing_else_is_guessed():
    axes = infer_axes(_inputs(pixel_values=torch.zeros(2, 3, 8, 8)), {})
    assert axes == {"pixel_values": {0: BATCH}}


def test_declared_axes_win_and_inputs_of_other_leading_sizes_stay_fixed():
    ids = torch.zeros(2, 5, dtype=torch.long)
    table = torch.zeros(7, 3)  # another leading size: not a batch
    declared = {"ids": {1: "tokens"}}
    axes = infer_axes(_inputs(ids=ids, table=table), declared)
    assert axes["ids"] == {1: "tokens"}  # as declared, nothing added
    assert "table" not in axes


def test_variants_are_made_of_the_example_s_own_values():
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    inputs = _inputs(ids=ids)
    axes = infer_axes(inputs, {})
    found = {v.name: v.inputs.named()["ids"] for v in variants(inputs, axes)}
    assert list(found) == ["batch-1", "batch-4", "seq-2", "seq-8"]
    assert found["batch-1"].tolist() == [[1, 2, 3, 4]]
    assert found["batch-4"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [5, 6, 7, 8], [1, 2, 3, 4]]
    assert found["seq-2"].tolist() == [[1, 2], [5, 6]]
    assert found["seq-8"].tolist() == [[1, 2, 3, 4, 1, 2, 3, 4], [5, 6, 7, 8, 5, 6, 7, 8]]
    assert batch_axes(inputs, axes) == {"ids": 0}


def test_a_batch_of_one_has_no_smaller_batch():
    inputs = _inputs(x=torch.zeros(1, 3))
    names = [v.name for v in variants(inputs, infer_axes(inputs, {}))]
    assert names == ["batch-2"]


def test_an_empty_batch_or_sequence_has_no_other_shapes():
    """A batch of 0 has no row to take or repeat: no batch-0 copy of the example and no batch
    consistency over no rows (which ended in numpy's 'need at least one array to
    concatenate', reported as the runtime's error); the run says nothing was checked."""
    inputs = _inputs(ids=torch.zeros(0, 5, dtype=torch.int64))
    axes = infer_axes(inputs, {})
    assert [v.name for v in variants(inputs, axes) if v.name.startswith("batch")] == []
    inputs = _inputs(ids=torch.zeros(2, 0, dtype=torch.int64))
    assert [v.name for v in variants(inputs, infer_axes(inputs, {}))] == ["batch-1", "batch-4"]


def test_token_inputs_of_two_lengths_infer_no_sequence_and_say_how_to_name_it():
    """An encoder-decoder's source and target ids (Marian): no length is the sequence, and a
    note says no seq-N shape is checked and how to name the axes (one name marks one size)."""
    from tconform.module_check.shapes import unseen_sequence

    inputs = _inputs(input_ids=torch.zeros(2, 12, dtype=torch.long),
                     decoder_input_ids=torch.zeros(2, 7, dtype=torch.long))  # fmt: skip
    axes = infer_axes(inputs, {})
    assert axes == {"input_ids": {0: BATCH}, "decoder_input_ids": {0: BATCH}}
    why = unseen_sequence(inputs, axes)
    assert "seq-N: not checked" in why and "input_ids 12, decoder_input_ids 7" in why
    assert "--dynamic NAME=0:batch,1:seq" in why
    named = {**axes, "input_ids": {0: BATCH, 1: SEQUENCE}}
    assert unseen_sequence(inputs, named) == ""  # named: varied, nothing to say
    one_length = _inputs(input_ids=torch.zeros(2, 12, dtype=torch.long))
    assert unseen_sequence(one_length, infer_axes(one_length, {})) == ""
