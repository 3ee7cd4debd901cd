"""The one packed-row layout (`jaxcredit.packed_rows`) that the update's packer and TRACE's gold scoring share."""

import numpy as np
import pytest

from jaxcredit.packed_rows import PackedRow, lay_out_rows


def test_a_row_lays_out_its_prefix_segments_and_scored_slots():
  row = PackedRow([5, 6, 7, 8])
  first = row.append([20, 21], start_position=4, prefix_limit=4)  # a continuation after the whole prefix
  row.score([first, first + 1])
  second = row.append([30, 31, 32], start_position=2, prefix_limit=2)  # a copy after the first 2 prefix tokens
  row.score([second + 2])
  assert (first, second, row.length, row.num_segments, row.num_slots) == (4, 6, 9, 2, 3)
  laid = lay_out_rows([row, PackedRow([9])], pad_id=-1, length_bucket=4, rows_multiple=4, slot_bucket=2)
  assert laid.tokens_NxL.shape == (4, 12) and laid.slots_NxK.shape == (4, 4)
  np.testing.assert_array_equal(laid.tokens_NxL[0], [5, 6, 7, 8, 20, 21, 30, 31, 32, -1, -1, -1])
  np.testing.assert_array_equal(laid.positions_NxL[0], [0, 1, 2, 3, 4, 5, 2, 3, 4, 0, 0, 0])
  np.testing.assert_array_equal(laid.segment_ids_NxL[0], [0, 0, 0, 0, 1, 1, 2, 2, 2, 0, 0, 0])
  np.testing.assert_array_equal(laid.prefix_limit_NxL[0], [0, 0, 0, 0, 4, 4, 2, 2, 2, 0, 0, 0])
  np.testing.assert_array_equal(laid.token_mask_NxL[0], [True] * 9 + [False] * 3)
  np.testing.assert_array_equal(laid.slots_NxK[0], [4, 5, 8, 0])
  np.testing.assert_array_equal(laid.slot_mask_NxK[0], [True, True, True, False])
  # The one-token row and the two empty rows that round the rows up to 4: pads only.
  assert laid.token_mask_NxL[1].tolist() == [True] + [False] * 11 and laid.tokens_NxL[1, 0] == 9
  assert not laid.token_mask_NxL[2:].any() and not laid.slot_mask_NxK[1:].any() and (laid.tokens_NxL[2:] == -1).all()


def test_buckets_must_be_positive():
  with pytest.raises(ValueError, match="lay_out_rows: slot_bucket must be >= 1, got 0"):
    lay_out_rows([PackedRow([1])], slot_bucket=0)
