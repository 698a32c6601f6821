"""ForecastPolicy (autoscaling/serve_policy.py) as Serve calls it, with contexts built by hand:
the ingress's and replicas' stats in, the cold pool's target out; time passed in, no Ray."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autoscaling.history_store import load_history
from autoscaling.serve_policy import ForecastPolicy
from serving.config import AppConfig
from serving.llm.autoscaling_stats import IngressStats, ReplicaStats, config_crc

T0 = 20_000 * 86400.0 + 3 * 3600  # 03:00 UTC


def app_args(history_path, **controller) -> dict:
    return {
        "pools": {"hot": {"num_replicas": 1}, "cold": {"min_replicas": 0, "max_replicas": 3}},
        "controller": {
            "interval_s": 10.0,
            "replica_capacity_rps": 2.0,
            "queue_tail_share": 0.0,  # these tests check the arithmetic without the margin
            "scale_down_tail_share": 0.0,  # and without the scale-down band
            "history_path": str(history_path),
            **controller,
        },
    }


def series(metrics: dict[str, float], t_s: float) -> dict:
    return {k: [SimpleNamespace(timestamp=t_s, value=v)] for k, v in metrics.items()}


def ctx(name: str, running: int, target: int, now_s: float, per_replica: dict | None = None):
    raw: dict = {}
    for replica, metrics in (per_replica or {}).items():
        for key, points in series(metrics, now_s).items():
            raw.setdefault(key, {})[replica] = points
    return SimpleNamespace(
        deployment_name=name,
        current_num_replicas=running,
        target_num_replicas=target,
        raw_metrics=raw,
        current_time=now_s,
    )


class Day:
    """The three deployments' contexts at one time; the ingress's count grows at rate_rps."""

    def __init__(self, args: dict) -> None:
        self.crc = config_crc(AppConfig.from_args(args).to_dict())
        self.num_requests = self.num_refused = 0
        self.cold_target = 0

    def contexts(
        self,
        now_s,
        rate_rps=1.0,
        waiting=0,
        offline=0,
        crc=None,
        dt_s=10.0,
        refused_rps=0.0,
        lora_load_s_per_request=0.0,
    ):
        self.num_requests += int(rate_rps * dt_s)
        self.num_refused += int(refused_rps * dt_s)
        crc = self.crc if crc is None else crc
        ingress = IngressStats(self.num_requests, offline, crc, self.num_refused)
        served = 50  # requests that got a first token in the replica's last window
        hot = ReplicaStats(
            num_waiting=waiting,
            num_running=1,
            window_requests=served,
            lora_load_s=lora_load_s_per_request * served,
        )
        return {
            "ingress-id": ctx("ingress", 1, 1, now_s, {"i0": ingress.to_metrics()}),
            "hot-id": ctx("hot", 1, 1, now_s, {"h0": hot.to_metrics()}),
            "cold-id": ctx("cold", self.cold_target, self.cold_target, now_s),
        }


def run(policy: ForecastPolicy, day: Day, start_s: float, ticks: int, **kw) -> list[int]:
    targets = []
    for i in range(ticks):
        decisions, state = policy(day.contexts(start_s + 10.0 * i, **kw))
        assert state == {}
        day.cold_target = decisions.get("cold-id", day.cold_target)
        targets.append(day.cold_target)
    return targets


def test_rate_sets_the_cold_target_and_the_batch_lanes_ask_is_a_floor(tmp_path):
    args = app_args(tmp_path / "h.json")
    policy, day = ForecastPolicy(app_args=args), Day(args)
    # 7 rps: 7 x headroom 1/0.85 / 2 rps per replica = 5 replicas: 1 hot + 3 cold (the max)
    assert run(policy, day, T0, 3, rate_rps=7.0)[-1] == 3
    low = run(policy, day, T0 + 30, 40, rate_rps=0.5)
    assert low[-1] == 0  # released once the stabilisation window passed
    assert run(policy, day, T0 + 430, 2, rate_rps=0.5, offline=2)[-1] == 2
    assert run(policy, day, T0 + 450, 2, rate_rps=0.5, offline=9)[-1] == 3  # within max
    reasons = [d["reason"] for d in load_history(tmp_path / "h.json").decisions]
    assert any("the batch lane asks for 2 cold" in r for r in reasons)


def test_adapter_slot_loads_the_replicas_report_derate_the_capacity_planned_with(tmp_path):
    args = app_args(tmp_path / "h.json")
    plain, day = ForecastPolicy(app_args=args), Day(args)
    # 3 rps x 1/0.85 at 2 rps per replica: 2 replicas, 1 hot + 1 cold
    assert run(plain, day, T0, 3, rate_rps=3.0)[-1] == 1
    loaded_args = app_args(tmp_path / "h2.json")
    loaded, day2 = ForecastPolicy(app_args=loaded_args), Day(loaded_args)
    # 0.25 s of slot loads per request: 1 / (1/2 + 0.25) = 1.33 rps each -> 3 replicas
    assert run(loaded, day2, T0, 3, rate_rps=3.0, lora_load_s_per_request=0.25)[-1] == 2
    last = load_history(tmp_path / "h2.json").decisions[-1]
    assert last["capacity_rps"] == pytest.approx(4 / 3)
    assert last["adapter_miss_s_per_request"] == pytest.approx(0.25)
    assert "adapter slot loads 250 ms/request derate 2" in last["reason"]


def test_a_queue_the_forecast_missed_triggers_the_emergency_path(tmp_path):
    args = app_args(tmp_path / "h.json")
    policy, day = ForecastPolicy(app_args=args), Day(args)
    assert run(policy, day, T0, 3, rate_rps=0.5)[-1] == 0
    # 30 waiting on one hot replica of 2 rps: 15 s of capacity > half the 1 s TTFT SLO
    assert run(policy, day, T0 + 30, 1, rate_rps=0.5, waiting=30)[-1] >= 1
    last = load_history(tmp_path / "h.json").decisions[-1]
    assert last["emergency"] is True and last["reason"].startswith("cold 0->")


def test_refusals_the_ingress_counts_trigger_the_emergency_path_with_no_queue(tmp_path):
    args = app_args(tmp_path / "h.json")
    policy, day = ForecastPolicy(app_args=args), Day(args)
    assert run(policy, day, T0, 3, rate_rps=0.5)[-1] == 0
    # the hot replica's admission refuses 1 of the 1.5 rps that now arrive and queues nothing
    assert run(policy, day, T0 + 30, 1, rate_rps=1.5, refused_rps=1.0)[-1] >= 1
    last = load_history(tmp_path / "h.json").decisions[-1]
    assert last["emergency"] is True and "refused for capacity (429)" in last["reason"]


def test_between_ticks_the_last_target_is_returned_without_a_new_decision(tmp_path):
    args = app_args(tmp_path / "h.json")
    policy, day = ForecastPolicy(app_args=args), Day(args)
    first, _ = policy(day.contexts(T0, rate_rps=7.0))
    n = len(policy.runtime.memory.history.decisions)
    again, _ = policy(day.contexts(T0 + 0.1, rate_rps=0.5, dt_s=0.1))  # Serve's 0.1 s loop
    assert again == first and len(policy.runtime.memory.history.decisions) == n


def test_another_apps_config_holds_the_pool(tmp_path):
    args = app_args(tmp_path / "h.json")
    policy, day = ForecastPolicy(app_args=args), Day(args)
    assert policy(day.contexts(T0, rate_rps=7.0, crc=day.crc + 1)) == ({}, {})


def test_a_new_policy_instance_restores_the_forecast_from_the_history_file(tmp_path):
    args = app_args(tmp_path / "h.json")
    policy, day = ForecastPolicy(app_args=args), Day(args)
    run(policy, day, T0, 5, rate_rps=3.0)
    policy.runtime.save(policy.runtime.clock.now(T0 + 40), T0 + 40)
    again = ForecastPolicy(app_args=args)  # what Serve builds after a redeploy or a restart
    assert again.runtime.memory.restored
    assert again.runtime.memory.forecaster.to_dict() == policy.runtime.memory.forecaster.to_dict()
    assert again.runtime.memory.state == policy.runtime.memory.state


def test_an_embed_app_is_refused_by_name():
    with pytest.raises(ValueError, match=r"model\.task is 'embed'"):
        ForecastPolicy(app_args={"model": {"task": "embed"}})


def test_stats_round_trip_through_serves_float_metrics():
    stats = IngressStats(12345, offline_cold_replicas=2, config_crc=2**31 - 1, num_refused=77)
    assert IngressStats.from_metrics(stats.to_metrics()) == stats
    assert all(isinstance(v, float) for v in stats.to_metrics().values())
    assert ReplicaStats.from_metrics({"num_waiting": 3.0}) == ReplicaStats(num_waiting=3)
    replica = ReplicaStats(num_waiting=1, window_requests=40, lora_load_s=0.125)
    assert ReplicaStats.from_metrics(replica.to_metrics()) == replica
