"""The live scaler's memory: a save and a load give back what was learned, an unreadable history
starts fresh, and a compressed clock resumes where the last save left it."""

from autoscaling.memory import ScalerMemory, anchor_clock


def test_a_saved_memory_loads_back_with_its_forecast_and_cold_starts(tmp_path):
    path = str(tmp_path / "h.json")
    fresh = ScalerMemory.load(path)
    assert not fresh.restored
    fresh.forecaster.observe(1000.0, 5.0)
    fresh.tracker.observe_running(0, 0.0)
    fresh.tracker.requested(1, 0.0)
    fresh.tracker.observe_running(1, 12.0)
    fresh.save(path, model_now_s=1600.0)
    again = ScalerMemory.load(path)
    assert again.restored
    assert again.forecaster.to_dict() == fresh.forecaster.to_dict()
    assert list(again.tracker.samples_s) == [12.0]
    assert again.history.saved_at_s == 1600.0


def test_an_unreadable_history_starts_fresh(tmp_path):
    path = tmp_path / "h.json"
    path.write_text("{not json")
    assert not ScalerMemory.load(str(path)).restored


def test_a_fixed_clock_start_resumes_from_the_last_save():
    clock = anchor_clock(clock_start_s=36000.0, time_scale=300.0, saved_at_s=40000.0, wall_s=5.0)
    assert clock.now(5.0) == 40000.0 and clock.now(6.0) == 40300.0
    assert anchor_clock(None, 1.0, 40000.0, wall_s=7.0).now(7.0) == 7.0  # real time: now


def _memory_with_held_target(tmp_path, saved_at_s: float) -> ScalerMemory:
    from autoscaling.policy import PolicyState

    path = str(tmp_path / "h.json")
    first = ScalerMemory.load(path)
    first.state = PolicyState(
        recent=((saved_at_s - 10.0, 2),), panic_until_s=saved_at_s + 50.0, cold_target=2
    )
    first.save(path, model_now_s=saved_at_s)
    return ScalerMemory.load(path)


def test_a_target_saved_more_than_a_window_ago_is_dropped(tmp_path):
    from autoscaling.policy import PolicyState

    memory = _memory_with_held_target(tmp_path, saved_at_s=1000.0)
    assert memory.state.cold_target == 2
    # The app starts again 10 minutes later: the last run's emergency says nothing about now.
    assert memory.forget_stale_state(model_now_s=1600.0, window_s=120.0)
    assert memory.state == PolicyState.initial()
    assert memory.forecaster is not None and memory.restored  # what was learned stays


def test_a_controller_restarted_mid_run_keeps_its_target(tmp_path):
    memory = _memory_with_held_target(tmp_path, saved_at_s=1000.0)
    assert not memory.forget_stale_state(model_now_s=1030.0, window_s=120.0)
    assert memory.state.cold_target == 2 and memory.state.panic_until_s == 1050.0


def test_starting_the_clock_drops_a_stale_target(tmp_path):
    from types import SimpleNamespace

    from autoscaling.policy import PolicyState

    memory = _memory_with_held_target(tmp_path, saved_at_s=1000.0)
    ctl = SimpleNamespace(clock_start_s=None, time_scale=1.0, stabilization_window_s=120.0)
    clock = memory.start_clock(ctl, wall_s=1600.0)  # real time: the app ran last 600 s ago
    assert clock.now(1600.0) == 1600.0
    assert memory.state == PolicyState.initial()
