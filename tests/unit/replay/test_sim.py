"""Replay simulator: fluid queue, pool mechanics, baselines and the CLI on small traces."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autoscaling.cli import main
from autoscaling.policy import PolicyConfig
from autoscaling.replay.baselines import OracleController, RateOracleController, StaticController
from autoscaling.replay.runner import POLICIES, ReplaySettings, run_replay
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.sim import Observation, Targets, simulate
from autoscaling.replay.traces import RateTrace, load_trace

DATA = Path(__file__).resolve().parents[2] / "data"
SERVEGEN = DATA / "servegen_language_m-small_total.csv"
AZURE = DATA / "azure_llm_2023_conv_first3000.csv.gz"
MINIMAL_YAML = """\
applications:
  - name: tideserve
    import_path: serving.app:build_app
    args:
      controller: {interval_s: 10, replica_capacity_rps: 10}
"""
SVC = ServiceModel(10.0, ttft_idle_s=0.2, ttft_full_s=0.4)


def test_fluid_queue_is_the_lindley_recursion():
    arrivals = np.array([5.0, 15.0, 15.0, 0.0, 0.0, 20.0])
    q, ttft, refused = SVC.queue(arrivals, np.ones(6), q0=7.0)
    assert q.tolist() == [2.0, 7.0, 12.0, 2.0, 0.0, 10.0]
    # second 0: utilisation 0.5 -> 0.3 s, plus 2 queued / 10 rps = 0.2 s of wait
    assert ttft[0] == pytest.approx(0.5)
    assert not refused.any()  # FIFO: nobody is turned away, however long the wait


def test_admitting_service_refuses_what_would_pass_the_ttft_and_keeps_the_rest_in_it():
    svc = ServiceModel(10.0, ttft_idle_s=0.2, ttft_full_s=0.4, admit_ttft_s=1.0)
    arrivals = np.array([5.0, 15.0, 15.0, 0.0, 0.0, 20.0])
    q, ttft, refused = svc.queue(arrivals, np.ones(6), q0=7.0)
    # at full load (0.4 s without a wait) the queue may hold 0.6 s x 10 rps = 6 requests;
    # second 0 is at half load (0.3 s), so 7 fit: the 2 left after serving 10 stay
    assert q.tolist() == pytest.approx([2.0, 6.0, 6.0, 0.0, 0.0, 6.0])
    assert refused.tolist() == pytest.approx([0.0, 1.0, 5.0, 0.0, 0.0, 4.0])
    assert (ttft <= 1.0 + 1e-9).all()
    # nothing is lost: served + queued + refused = arrived
    served = np.minimum(np.r_[7.0, q[:-1]] + arrivals - refused, 10.0)
    assert served.sum() + q[-1] + refused.sum() == pytest.approx(7.0 + arrivals.sum())


def test_admission_below_the_full_load_ttft_is_an_error_naming_it():
    with pytest.raises(ValueError, match="admit_ttft_s"):
        ServiceModel(10.0, ttft_full_s=0.5, admit_ttft_s=0.3)


class StepUp:
    """Asks for `n` cold replicas from t=100 s on."""

    name, hot_replicas = "step", 1

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen: list[Observation] = []

    def tick(self, now_s: float, obs: Observation) -> Targets:
        self.seen.append(obs)
        return Targets(self.n if now_s >= 100 else 0)


def test_a_cold_replica_costs_gpu_time_from_request_and_serves_after_cold_start():
    arrivals = np.full(400, 5.0)
    res = simulate(StepUp(2), arrivals, arrivals, 0.0, SVC, 10, cold_start_s=120.0)
    assert res.replicas[99] == 1 and res.replicas[100] == 3  # starting replicas hold GPUs
    assert res.ready[219] == 1 and res.ready[220] == 3  # ready 120 s after the request
    assert res.num_scale_events == 1


def test_controllers_see_no_rate_inside_a_gap():
    arrivals = np.full(100, 5.0)
    observed = arrivals.copy()
    observed[30:60] = np.nan
    ctl = StepUp(0)
    simulate(ctl, arrivals, observed, 0.0, SVC, 10, 120.0)
    rates = [o.rate_rps for o in ctl.seen]
    assert rates[4] is None and rates[5] is None and rates[7] == 5.0


def test_overload_builds_a_queue_that_the_controller_observes():
    arrivals = np.full(60, 25.0)  # 2.5x one replica
    ctl = StepUp(0)
    res = simulate(ctl, arrivals, arrivals, 0.0, SVC, 10, 120.0)
    assert ctl.seen[1].queue_depth == pytest.approx(150.0)
    assert ctl.seen[1].queue_wait_s == pytest.approx(15.0)
    assert res.ttft_s[-1] > 50


def test_oracle_holds_what_the_next_cold_start_window_needs():
    arrivals = np.zeros(300)
    arrivals[200:] = 30.0  # needs 3 replicas from 200 s
    oracle = OracleController("oracle", arrivals, 0.0, 10.0, lookahead_s=130)
    res = simulate(oracle, arrivals, arrivals, 0.0, SVC, 10, cold_start_s=120.0)
    assert res.ready[200:].min() >= 3
    assert res.queue.max() == 0.0
    assert res.replicas[:70].max() == 0  # nothing held before it is needed


def test_the_rate_oracle_holds_the_known_rates_need_plus_its_queue_margin_not_the_draws():
    rate = np.full(400, 25.0)
    rate[250:] = 45.0
    draws = np.random.default_rng(0).poisson(rate).astype(float)
    cfg = PolicyConfig(replica_capacity_rps=10.0, ttft_slo_s=1.0)
    loose = RateOracleController("r", rate, 0.0, 10.0, 130, replace(cfg, queue_tail_share=0.5))
    tight = RateOracleController("r", rate, 0.0, 10.0, 130, replace(cfg, queue_tail_share=1e-6))
    obs = Observation(None, 0.0, 0.0, 0, 0, 0)

    def held(ctl, t):
        return ctl.tick(t, obs).cold

    # 25 rps + a 0.7 rps margin: 3 replicas; from 250 s - 130 s on, 45 rps + 0.7: 5
    assert (held(loose, 0), held(loose, 119), held(loose, 120), held(loose, 399)) == (3, 3, 5, 5)
    # a one-in-a-million queue tail needs 9.9 rps more at 25 rps: 4 replicas, then 6
    assert (held(tight, 0), held(tight, 399)) == (4, 6)
    # it knows the rate, not the draws: the per-second oracle of the draws holds for their peaks
    by_draws = OracleController("oracle", draws, 0.0, 10.0, lookahead_s=130)
    assert held(by_draws, 0) > held(loose, 0)


def test_servegen_gaps_load_as_missing_and_azure_as_per_second_counts():
    sg = load_trace(SERVEGEN)
    assert (sg.kind, sg.bin_s, sg.num_gaps, len(sg.rates_rps)) == ("rate_series", 600.0, 37, 2016)
    az = load_trace(AZURE)
    assert az.kind == "per_request" and az.bin_s == 1.0
    assert az.rates_rps.sum() == 3000  # every request of the sample counted once


def small_trace() -> RateTrace:
    """Three days of m-small with one gap at 05:00 on day 3: train 2 days, judge 6 hours."""
    r = load_trace(SERVEGEN).rates_rps[: 3 * 144].copy()
    r[2 * 144 + 30] = np.nan
    return RateTrace("m-small-3d", "rate_series", 600.0, 0.0, r)


def test_replay_reports_every_policy_with_the_required_fields():
    cfg = PolicyConfig(replica_capacity_rps=10.0, ttft_slo_s=1.0)
    report, _, prep = run_replay(
        small_trace(),
        cfg,
        ServiceModel(10.0),
        ReplaySettings(scale_to_peak_replicas=10, train_days=2, judge_days=0.25),
    )
    rows = {r["name"]: r for r in report["policies"]}
    assert tuple(rows) == POLICIES
    for r in rows.values():
        assert {"gpu_hours", "slo_attainment", "ttft_p99_s", "num_scale_events"} <= set(r)
        assert 0.0 <= r["slo_attainment"] <= 1.0
    assert rows["static_peak"]["gpu_hours"] == pytest.approx(10 * 6)  # 10 replicas for 6 h
    assert rows["oracle"]["gpu_hours"] < rows["static_peak"]["gpu_hours"]
    assert rows["oracle"]["slo_attainment"] == 1.0
    # tideserve's hot pool was learned from the training days and is never scaled away
    assert 1 <= rows["tideserve"]["hot_replicas"] <= rows["tideserve"]["max_replicas"]
    assert report["judged_span_s"] == 6 * 3600 and not prep.scored[30 * 600 + 1]
    assert "fluid" in report["service_model"]


def test_cli_replays_a_trace_and_writes_json_and_plot(tmp_path):
    trace = tmp_path / "t.csv"
    rows = ["window_start_s,total_rate_rps"] + [f"{600 * i},{50 + (i % 12) * 5}" for i in range(12)]
    trace.write_text("\n".join(rows) + "\n")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    config = tmp_path / "cluster.yaml"
    config.write_text(MINIMAL_YAML)
    rc = main(
        [
            "replay",
            "--trace",
            str(trace),
            "--config",
            str(config),
            "--policy",
            "tideserve",
            "--policy",
            "static_peak",
            "--scale-to-peak-replicas",
            "5",
            "--replica-capacity-rps",
            "10",
            "--cold-start-s",
            "60",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert [p["name"] for p in report["policies"]] == ["tideserve", "static_peak"]
    assert report["trace"] == "t" and report["span_s"] == 7200
    assert png.stat().st_size > 10_000


def test_cli_replays_measured_cold_starts(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "window_start_s,total_rate_rps\n" + "".join(f"{600 * i},{50 + i}\n" for i in range(12))
    )
    starts = tmp_path / "cold_start.json"
    trials = [{"deploy_to_ready_s": s} for s in (52.4, 18.3, 19.4, 18.3)]
    starts.write_text(json.dumps({"machine": {"cpu": "AMD EPYC"}, "trials": trials}))
    config = tmp_path / "cluster.yaml"
    config.write_text(MINIMAL_YAML)
    out = tmp_path / "r.json"
    args = ["replay", "--trace", str(trace), "--config", str(config), "--policy", "tideserve"]
    assert main([*args, "--cold-starts", str(starts), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["cold_start_s"] == 18.3 and report["cold_starts"]["p95_s"] == 52.4
    printed = capsys.readouterr().out
    assert "median 18.3 s, p95 52.4 s (tideserve's lead: it + the margin)" in printed
    with pytest.raises(SystemExit):  # one or the other
        main([*args, "--cold-starts", str(starts), "--cold-start-s", "60"])


def test_cli_rejects_an_unknown_trace_format(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    config = tmp_path / "cluster.yaml"
    config.write_text(MINIMAL_YAML)
    assert main(["replay", "--trace", str(bad), "--config", str(config)]) == 2
    assert "unknown trace columns" in capsys.readouterr().err


def test_static_controller_never_changes():
    ctl = StaticController("static_peak", 4)
    obs = Observation(1.0, 0.0, 0.0, 4, 0, 0)
    assert ctl.tick(0.0, obs).cold == 0 and ctl.hot_replicas == 4
