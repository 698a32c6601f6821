"""The controller's history file: atomic round trip, refuses what it cannot read."""

from __future__ import annotations

import json

import pytest

from autoscaling.forecast import Forecaster
from autoscaling.history_store import MAX_DECISIONS, History, load_history, save_history


def _learned_forecaster() -> Forecaster:
    forecaster = Forecaster()
    for i in range(3 * 144):  # three days of 10-minute rates with a noon peak
        t = i * 600.0
        forecaster.observe(t, 10.0 if 11 <= (t % 86400) / 3600 < 14 else 2.0)
    return forecaster


def test_round_trip_keeps_the_forecast(tmp_path):
    forecaster = _learned_forecaster()
    history = History(
        forecaster=forecaster.to_dict(),
        cold_start_samples_s=[8.5, 12.0],
        policy_state={"recent": [[1.0, 2]], "panic_until_s": None, "cold_target": 2},
        saved_at_s=3 * 86400.0,
    )
    history.add_decision({"reason": "cold 0->2: forecast peak"})
    path = tmp_path / "sub" / "history.json"  # the directory is created
    save_history(path, history)
    loaded = load_history(path)
    assert loaded == history
    restored = Forecaster.from_dict(loaded.forecaster)
    now = 3 * 86400.0 + 10 * 3600
    assert restored.predict(now, 3600, 60) == forecaster.predict(now, 3600, 60)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_no_file_is_no_history(tmp_path):
    assert load_history(tmp_path / "absent.json") is None


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"version": 99}), "format version 99"),
        (json.dumps([1, 2]), "format version 'list'"),
        (json.dumps({"version": 1, "cold_start_samples_s": ["x"]}), "must be numbers"),
    ],
)
def test_unreadable_history_is_an_error_naming_the_file(tmp_path, content, needle):
    path = tmp_path / "history.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle) as err:
        load_history(path)
    assert str(path) in str(err.value)


def test_a_failed_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "history.json"
    save_history(path, History(cold_start_samples_s=[1.0]))
    with pytest.raises(TypeError):
        save_history(path, History(decisions=[{"bad": object()}]))  # not JSON-serialisable
    assert load_history(path).cold_start_samples_s == [1.0]
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]


def test_only_the_last_decisions_are_kept():
    history = History()
    for i in range(MAX_DECISIONS + 7):
        history.add_decision({"i": i})
    assert len(history.decisions) == MAX_DECISIONS
    assert history.decisions[0] == {"i": 7}
