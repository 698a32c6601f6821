"""What the controller measures, reduced to policy inputs (pure; time passed in)."""

from __future__ import annotations

import pytest

from autoscaling.signals import (
    ModelClock,
    RateMeter,
    ReportBook,
    adapter_miss_s_per_request,
    lead_override_s,
)
from autoscaling.status_cli import format_status
from serving.config import AppConfig
from serving.llm.messages import ReplicaReport


def _report(replica: str, pool: str = "hot", waiting: int = 0, wait_s: float = 0.0):
    return ReplicaReport(
        pool=pool,
        replica_id=replica,
        num_waiting=waiting,
        num_running=1,
        queue_wait_p99_s=wait_s,
        kv_use_fraction=0.5,
    )


def test_queue_signals_sum_depth_and_take_the_worst_wait_over_fresh_reports():
    book = ReportBook()
    book.record(_report("a", "hot", waiting=3, wait_s=0.2), t_s=100.0)
    book.record(_report("b", "cold", waiting=2, wait_s=0.9), t_s=104.0)
    book.record(_report("c", "cold", waiting=50, wait_s=9.0), t_s=80.0)  # stale: replica gone
    signals = book.signals(now_s=105.0, max_age_s=10.0)
    assert signals.queue_depth == 5
    assert signals.queue_wait_s == 0.9
    assert signals.num_reporting == {"hot": 1, "cold": 1}
    assert book.signals(now_s=200.0, max_age_s=10.0).queue_depth == 0  # all stale now


def test_adapter_load_seconds_per_request_weigh_each_replica_by_its_traffic():
    # each replica: requests served in its last window, and the slot-load seconds in it
    busy = ReplicaReport("hot", "a", window_requests=90, lora_load_s=0.9)
    quiet = ReplicaReport("cold", "b", window_requests=10, lora_load_s=0.6)
    idle = ReplicaReport("cold", "c")
    reports = ReportBook()
    for r in (busy, quiet, idle):
        reports.record(r, t_s=0.0)
    # (0.9 + 0.6) s over 100 requests; the mean of the two replicas' ratios would say 35 ms
    assert reports.signals(1.0, 10.0).adapter_miss_s_per_request == pytest.approx(0.015)
    assert adapter_miss_s_per_request([(0, 0.3)]) == 0.0  # loads with no request served
    assert ReportBook().signals(0.0, 10.0).adapter_miss_s_per_request == 0.0


def test_a_newer_report_replaces_the_replicas_last_one():
    book = ReportBook()
    book.record(_report("a", waiting=9), t_s=0.0)
    book.record(_report("a", waiting=1), t_s=2.0)
    assert book.signals(now_s=3.0, max_age_s=10.0).queue_depth == 1


def test_rate_from_a_cumulative_counter_and_missing_windows():
    meter = RateMeter()
    assert meter.update(100, t_s=0.0) is None  # first reading
    assert meter.mid_s is None
    assert meter.update(120, t_s=10.0) == 2.0
    assert meter.mid_s == 5.0  # the rate belongs to the middle of the span it counted
    assert meter.update(5, t_s=20.0) is None  # the counter went back: the ingress restarted
    assert meter.mid_s is None
    assert meter.update(15, t_s=25.0) == 2.0
    assert meter.mid_s == 22.5


def test_model_clock_scales_time_not_rates():
    clock = ModelClock(start_s=36000.0, wall0_s=1000.0, time_scale=300.0)
    assert clock.now(1012.0) == 36000.0 + 3600.0  # 12 real seconds = one model hour
    assert clock.to_model_s(8.0) == 2400.0
    assert clock.to_wall_s(2400.0) == 8.0
    with pytest.raises(ValueError, match="time_scale"):
        ModelClock(0.0, 0.0, time_scale=0.0)


def test_lead_override_applies_only_inside_its_window():
    cfg = AppConfig.from_args(
        {
            "controller": {
                "lead_overrides": [
                    {"start": "11:30", "end": "12:30", "lead_s": 1200},
                    {"start": "23:00", "end": "01:00", "lead_s": 300},
                ]
            }
        }
    )
    day = 19000 * 86400.0
    assert lead_override_s(cfg.controller, day + 11.75 * 3600) == 1200
    assert lead_override_s(cfg.controller, day + 0.5 * 3600) == 300  # wraps midnight
    assert lead_override_s(cfg.controller, day + 15 * 3600) is None


def test_a_controller_section_turns_the_controller_on_and_round_trips():
    on = AppConfig.from_args({"controller": {"interval_s": 5, "time_scale": 60}})
    assert on.controller.enabled and on.controller.time_scale == 60.0
    assert AppConfig.from_args(on.to_dict()) == on
    assert not AppConfig.from_args({}).controller.enabled
    assert not AppConfig.from_args({"controller": {"enabled": False}}).controller.enabled
    with pytest.raises(ValueError, match=r"controller\.time_scale=-1"):
        AppConfig.from_args({"controller": {"time_scale": -1}})
    with pytest.raises(ValueError, match=r"controller\.app_name"):
        AppConfig.from_args({"controller": {"app_name": ""}})


def test_status_text_shows_forecast_targets_and_reasons(tmp_path, capsys):
    from autoscaling.cli import main
    from autoscaling.history_store import History, save_history

    decision = {
        "t_model_s": 19000 * 86400.0 + 11 * 3600,
        "t_wall_s": 0.0,
        "hot_target": 1,
        "cold_target": 2,
        "emergency": False,
        "lead_s": 1200.0,
        "reason": "cold 0->2: forecast peak 31 rps ...",
        "rate_rps": 12.0,
        "forecast": {"rate_at_lead_rps": 30.0, "peak_rps": 31.0, "basis": "daily profile"},
        "hot_running": 1,
        "cold_running": 2,
        "queue_depth": 0,
        "queue_wait_s": 0.01,
        "policy": {"cold_start_p95_s": 41.5, "cold_start_samples_s": [30.0, 41.5]},
    }
    text = format_status("tideserve", "h.json", [decision])
    assert "capacity " not in text  # a record from before the capacity model
    derated = {**decision, "capacity_rps": 4 / 3, "adapter_miss_s_per_request": 0.25}
    line = "capacity      1.33 rps per replica planned with (adapter slot loads 250 ms/request)"
    assert line in format_status("tideserve", "h.json", [derated])
    assert "model time    2022-01-08 11:00 UTC" in text
    assert "peak 31.00 rps (daily profile)" in text
    assert "hot 1, cold 2" in text and "p95 41.5 s over 2 samples" in text
    assert "  - cold 0->2: forecast peak 31 rps ..." in text
    path = tmp_path / "h.json"
    assert main(["status", "--history", str(path)]) == 2  # no file yet: says so
    assert "no decisions in" in capsys.readouterr().err
    save_history(path, History(decisions=[decision]))
    assert main(["status", "--history", str(path)]) == 0
    assert "targets       hot 1, cold 2" in capsys.readouterr().out


def test_replica_reporter_looks_the_controller_up_sparingly_and_pushes_its_numbers(monkeypatch):
    import ray

    from autoscaling.reporter import LOOKUP_EVERY_CALLS, ControllerReporter, controller_name

    lookups: list[tuple[str, str]] = []
    sent: list[dict] = []

    class Handle:
        class report:  # mimics an actor method: handle.report.remote(payload)
            @staticmethod
            def remote(payload):
                sent.append(payload)

    controller_up = False

    def get_actor(name, namespace):
        lookups.append((name, namespace))
        if not controller_up:
            raise ValueError("no such actor")
        return Handle

    monkeypatch.setattr(ray, "get_actor", get_actor)
    reporter = ControllerReporter("shop", "cold", "r1")
    for _ in range(2 * (LOOKUP_EVERY_CALLS + 1)):
        reporter.report(ReplicaReport("cold", "r1", 1, 2, 0.3, 0.4))  # no controller: at most
        # one lookup per window
    assert len(lookups) == 2 and sent == []
    assert lookups[0] == (controller_name("shop"), "tideserve")
    controller_up = True
    for _ in range(LOOKUP_EVERY_CALLS + 1):
        reporter.report(ReplicaReport("cold", "r1", 3, 1, 0.5, 0.25))
    assert sent[-1] == ReplicaReport("cold", "r1", 3, 1, 0.5, 0.25)
    assert len(lookups) == 3  # found once, then the handle is reused
