"""Decodes are grouped by context length so the KV gather pads little (serving/engine/runner.py)."""

from __future__ import annotations

import itertools

from serving.engine.runner import group_by_length


def test_similar_lengths_stay_in_one_group():
    assert group_by_length([100, 90, 80, 70, 60, 51]) == [(0, 6)]


def test_a_group_ends_where_contexts_halve():
    lengths = [400, 390, 380, 370, 200, 190, 180, 170, 20, 10, 9, 8]
    assert group_by_length(lengths) == [(0, 4), (4, 8), (8, 12)]


def test_groups_are_never_smaller_than_min_size_nor_more_than_max():
    lengths = [1000, 900, 400, 300, 100, 90, 30, 20, 8, 4, 2, 1]
    groups = group_by_length(lengths, max_groups=3, min_size=3)
    assert len(groups) <= 3
    assert all(end - start >= 3 for start, end in groups)
    # contiguous cover of every row, in order
    assert groups[0][0] == 0 and groups[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(groups))


def test_no_decodes_no_groups():
    assert group_by_length([]) == []
