"""One live tick for both scalers (autoscaling/live_tick.py): Serve's policy
(autoscaling/policy_runtime.py) and the external-scaler actor (autoscaling/controller.py) fed the
same readings decide the same cold targets, the batch lane's ask included. No Ray: the actor is
built without its loop thread and its Serve calls are replaced; time is passed in."""

from __future__ import annotations

import threading

import pytest

from autoscaling import controller as controller_mod
from autoscaling.cold_start import ColdStartTracker
from autoscaling.controller import ForecastController
from autoscaling.live_tick import LiveMeters, PoolView, live_tick, note_cold_target
from autoscaling.memory import ScalerMemory
from autoscaling.policy import PolicyConfig
from autoscaling.policy_runtime import PolicyRuntime
from autoscaling.signals import ModelClock, ReportBook
from serving.config import AppConfig
from serving.llm.autoscaling_stats import IngressStats
from serving.serve_status import DeploymentCounts

T0 = 20_000 * 86400.0 + 3 * 3600  # 03:00 UTC


def app_cfg(history_path) -> AppConfig:
    return AppConfig.from_args(
        {
            "pools": {"hot": {"num_replicas": 1}, "cold": {"min_replicas": 0, "max_replicas": 4}},
            "controller": {
                "interval_s": 10.0,
                "replica_capacity_rps": 2.0,
                "history_path": str(history_path),
            },
        }
    )


class FakeScaler:
    path_used = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def scale(self, deployment: str, target: int) -> None:
        self.calls.append((deployment, target))


def bare_controller(cfg: AppConfig, monkeypatch, world: dict) -> ForecastController:
    """The actor's state without Ray or its loop thread; Serve's reads come from `world`."""
    ctl = ForecastController.__new__(ForecastController)
    ctl.cfg, ctl.app = cfg, cfg.controller.app_name
    ctl.policy_cfg = PolicyConfig.from_app_config(cfg)
    ctl.clock, ctl.history_path = None, cfg.controller.history_path
    ctl.lock, ctl.book, ctl.meters = threading.Lock(), ReportBook(), LiveMeters()
    ctl.memory = ScalerMemory.load(ctl.history_path)
    ctl.scaler, ctl.applied, ctl.last, ctl.errors = FakeScaler(), {}, {}, []
    ctl._saved_wall, ctl._app_missing_since = 0.0, None
    monkeypatch.setattr(controller_mod, "read_counts", lambda app: world["counts"])
    monkeypatch.setattr(controller_mod, "ingress_stats", lambda app: world["ingress"])
    monkeypatch.setattr(controller_mod, "announce_target", lambda app, dep, target: False)
    return ctl


def play(tmp_path, monkeypatch, rates_and_asks: list[tuple[float, int]]):
    """Both scalers through the same ticks; returns their cold targets, tick by tick."""
    world: dict = {}
    actor = bare_controller(app_cfg(tmp_path / "actor.json"), monkeypatch, world)
    policy = PolicyRuntime(app_cfg(tmp_path / "policy.json"), config_crc=0)
    num_requests, policy_cold, actor_targets, policy_targets = 0, 0, [], []
    for i, (rate_rps, ask) in enumerate(rates_and_asks):
        wall = T0 + 10.0 * i
        num_requests += int(rate_rps * 10)
        ingress = IngressStats(num_requests=num_requests, offline_cold_replicas=ask)
        actor_cold = actor.applied.get("cold", 0)
        world["ingress"] = ingress
        world["counts"] = {"hot": DeploymentCounts(1, 1), "cold": DeploymentCounts(0, actor_cold)}
        actor._tick(wall)
        actor_targets.append(actor.applied["cold"])
        view = PoolView(ingress, wall, 1, 0, policy_cold, 0, 0.0)
        policy_cold = policy.step(view, wall)
        policy_targets.append(policy_cold)
    return actor_targets, policy_targets


def test_the_actor_and_serves_policy_decide_the_same_targets_batch_ask_included(
    tmp_path, monkeypatch
):
    # quiet traffic (no forecast need), then the batch lane asks for 2 cold replicas, then 9
    # (the pool's max is 4), then it stops asking
    ticks = [(0.5, 0)] * 3 + [(0.5, 2)] * 3 + [(0.5, 9)] * 2 + [(0.5, 0)] * 2
    actor, policy = play(tmp_path, monkeypatch, ticks)
    assert actor == policy
    assert actor[2] == 0 and actor[3] == 2 and actor[6] == 4  # the ask is a floor, within max
    assert actor[-1] == 4  # scale-down waits for the stabilisation window, on both


def test_the_actor_and_serves_policy_follow_the_same_rate(tmp_path, monkeypatch):
    # 7 rps needs 7 / 0.85 / 2 = 5 replicas: 1 hot + 4 cold
    actor, policy = play(tmp_path, monkeypatch, [(0.5, 0)] * 2 + [(7.0, 0)] * 4)
    assert actor == policy
    assert actor[-1] == 4


def test_live_tick_reads_rates_from_cumulative_counts_and_a_missing_report_is_a_gap(tmp_path):
    cfg = app_cfg(tmp_path / "h.json")
    memory, meters = ScalerMemory.load(str(tmp_path / "h.json")), LiveMeters()
    clock = ModelClock(start_s=T0, wall0_s=T0)
    pol = PolicyConfig.from_app_config(cfg)

    def view(n, ask=0, ingress=True):
        stats = IngressStats(num_requests=n, offline_cold_replicas=ask) if ingress else None
        return PoolView(stats, T0, 1, 0, 0, 0, 0.0)

    first = live_tick(memory, meters, clock, cfg.controller, pol, view(100), T0)
    assert first.rate_rps is None  # one reading is no rate yet
    meters = LiveMeters()
    meters.read(IngressStats(num_requests=100), T0)
    assert meters.read(IngressStats(num_requests=300, num_refused=40), T0 + 10) == (20.0, 4.0)
    assert meters.read(None, T0 + 20) == (None, None)
    assert meters.read(IngressStats(num_requests=700, num_refused=40), T0 + 30) == (20.0, 0.0)
    out = live_tick(memory, LiveMeters(), clock, cfg.controller, pol, view(0, ask=3), T0 + 10)
    assert out.decision.cold_target == 3 and "batch lane asks for 3" in out.decision.reason
    assert out.record["cold_target"] == 3 and out.model_now_s == pytest.approx(T0 + 10)


def test_a_raised_target_starts_cold_start_clocks_and_a_lowered_one_cancels_them():
    tracker = ColdStartTracker([])
    note_cold_target(tracker, 0, 2, 100.0)
    assert tracker.num_pending == 2
    note_cold_target(tracker, 2, 1, 101.0)
    assert tracker.num_pending == 1
    note_cold_target(tracker, 1, 1, 102.0)
    assert tracker.num_pending == 1
