"""FIT_ON: for every default of the autoscaling policy that was chosen by replaying traffic
(`PolicyConfig` in autoscaling/policy_config.py, `HeadroomConfig` in autoscaling/headroom_config.py,
`ForecastConfig` in autoscaling/forecast.py and the replay's `ReplaySettings.hot_quantile`), what
it was fit on.

Under the validation protocol (autoscaling/replay/protocol.py, docs/autoscaling.md) settings are
fit on training and validation splits only; the shared traces' days 8-14 are a test set. The
entries marked "test days" were chosen before that protocol existed and saw the test set: their
results there are not an unbiased estimate.
"""

from __future__ import annotations

_TEST_DAYS = "the shared traces' days 8-14 (the test set; chosen before the protocol)"
# the tenth tuning run: the validation splits with the fifth shape, seeds 0 and 1, merged
_TENTH = "autoscaling_validation_frontier_tenth_run.json"
FIT_ON: dict[str, str] = {
    "HeadroomConfig.quantile": "not fit: the SLO's target share (99.5%)",
    "HeadroomConfig.num_volatility_classes": (
        f"{_TEST_DAYS}, one seed, held-mean replay; kept on the validation splits, seed 0, "
        "interpolated replay: 3 against 1 and 5 (autoscaling_validation_frontier_refit.json)"
    ),
    "HeadroomConfig.volatility_num_jumps": (
        "validation splits only, seeds 0 and 1, interpolated replay: 3 jumps (half an hour) "
        "against 6, the earlier default fit on the test days, and 12 "
        "(autoscaling_validation_frontier_refit.json, _refit_seed1.json); kept against 6 and 12 "
        f"on the 12 splits with turning_volatile ({_TENTH})"
    ),
    "HeadroomConfig.num_bands": (
        f"{_TEST_DAYS}, one seed, held-mean replay; kept on the validation splits, seed 0, "
        "interpolated replay: 1 against 2 and 6 "
        "(autoscaling_validation_frontier_bands_profile.json)"
    ),
    "HeadroomConfig.feedback_gain_per_s": (
        f"{_TEST_DAYS}, one seed, held-mean replay; kept on the validation splits, seed 0, "
        "interpolated replay: 1e-4 against 3e-5 and 3e-4 "
        "(autoscaling_validation_frontier_refit.json); kept against 3e-4 on the 12 splits with "
        "turning_volatile, seeds 0-3: 43 of 48 replays cheaper than Knative for both, 1e-4 "
        "cheaper by 0.0004 of the oracle's GPU-hours, 3e-4's T3a statistic larger (4.11 "
        "against 2.81 violation-minutes per day; autoscaling_validation_frontier_gain_four_seeds"
        ".json); kept again on seeds 4-5, which no run had used, under the rule amended to "
        "break a cost tie on T3a's lower bound: 3e-4 missed T1 on one replay of 24 (99.4999% "
        "in SLO; autoscaling_validation_frontier_gain_seeds_4_5.json, _gain_six_seeds.json)"
    ),
    "HeadroomConfig.extrapolate_volatility_above": (
        "validation splits only (12, with turning_volatile), seeds 0 and 1, interpolated "
        "replay: 0.99 against off (the tenth run's defaults) and 0.9; by the rule amended in "
        "the eleventh run, 0.99 and off tie on T1, T3a's sign, 21 of 24 replays cheaper than "
        "Knative and cost (0.9034 against 0.9035 of the oracle's GPU-hours, within the seeds' "
        "noise), and 0.99's T3a interval has the larger lower bound (0.35 against 0.33), "
        "a hair; 0.9 costs more at the default quantile and its T3a is smaller "
        "(autoscaling_validation_frontier_extrapolate_ranked.json)"
    ),
    "HeadroomConfig.extrapolate_reference_lag_s": (
        "validation splits only (12), seeds 0 and 1, interpolated replay: off against a day, "
        "which costs more to 99.5% (0.9058 against 0.9034 of the oracle's GPU-hours) with a "
        "smaller T3a statistic (1.59 against 2.87 violation-minutes per day; "
        "autoscaling_validation_frontier_extrapolate_lag_ranked.json)"
    ),
    "HeadroomConfig.class_pooling": (
        "validation splits only (12), seeds 0 and 1, interpolated replay: off against 0.25 and "
        "0.5 of the way to the pooled headroom; all three tie on T1, T3a's sign and 21 of 24 "
        "replays cheaper than Knative, and 30 s of plan horizon ranked above them "
        "(autoscaling_validation_frontier_twelfth_run.json)"
    ),
    "HeadroomConfig.clip": (
        "(0.5, 4.0) not fit; a floor (clip[0]) of 1.05 and 1.10 against none on the 12 validation "
        "splits, seeds 0 and 1, interpolated replay: both hold T1 and rank below none, cheaper "
        "than Knative on 11 and 2 of 24 replays against 21 "
        "(autoscaling_validation_frontier_fourteenth_run.json)"
    ),
    "PolicyConfig.horizon_s": (
        "validation splits only (12, with turning_volatile), seeds 0 and 1, interpolated "
        "replay: 30 s against 60 s (the default before, never fit) and 0; 30 s ties 60 s on T1, "
        "T3a's sign, 21 of 24 replays cheaper than Knative and cost (0.9034 of the oracle's "
        "GPU-hours to 99.5% for both), and T3a's interval has the larger lower bound (1.08 "
        "against 0.35 violation-minutes per day); 0 misses T1 on one replay "
        "(autoscaling_validation_frontier_twelfth_run.json)"
    ),
    "HeadroomConfig.window_s": "not fit: a week, so every weekday is in it",
    "ForecastConfig.profile_weight": (
        "validation splits only, seeds 0 and 1, interpolated replay: 0.5 against 0.3, 0.9 "
        "and 0.7, the earlier default fit on all 14 days of both shared traces "
        "(autoscaling_validation_frontier_bands_profile.json, _profile_0_3.json, "
        "_profile_seed1.json)"
    ),
    "ReplaySettings.hot_quantile": (
        f"{_TEST_DAYS}, seeds 0-2, held-mean replay; kept on the validation splits, seed 0: "
        "the 1st percentile and the minimum cost within 0.2% of it "
        "(autoscaling_validation_hot_pool.json)"
    ),
    "PolicyConfig.stabilization_window_s": (
        "validation splits only (the four shapes' rolling origins and the shared traces' "
        "training week), seed 0, interpolated replay: 60 s with the queue margin and the 30 s "
        "rate window against 120 s (120 s was fit on m-small's days 8-14 before the protocol); "
        "kept in the thirteenth run (12 validation splits, seeds 0 and 1, horizon 30 s): 30 s "
        "and 0 s miss T1 on one split (autoscaling_validation_frontier_thirteenth_run.json)"
    ),
    "PolicyConfig.queue_tail_share": (
        "validation splits only, seeds 0 and 1, interpolated replay, with the scale-down band "
        "at 1%: 0.5 against 0.05, 0.1, 0.2 and 0.4 (19 of 20 replays cheaper than Knative to "
        "99.5% against 17, 17, 18 and 19; mean GPU-hours to 99.5% 0.9027 of the oracle's "
        "against 0.9056, 0.9047, 0.9038 and 0.9030; autoscaling_validation_frontier_band_tails"
        ".json, _band_tail_0_4.json, _band_tail_0_5.json, _scale_down_band.json). Before the "
        "band, 0.05 was chosen on seed 0 against 0.005 and 0.01 "
        "(autoscaling_validation_frontier_trend_tail.json); the margin's form is not fit "
        "(the heavy-traffic queue tail); kept against 0.05 and 0.01 on the 12 splits with "
        f"turning_volatile ({_TENTH})"
    ),
    "PolicyConfig.scale_down_tail_share": (
        "validation splits only, seeds 0 and 1, interpolated replay: 0.01 against none and "
        "0.001: as many splits cheaper than Knative as none, the same mean GPU-hours to 99.5% "
        "(within 0.0004 of the oracle's at each seed) and T3a's interval above 0 on these "
        "splits (autoscaling_validation_frontier_scale_down_band.json), with queue_tail_share "
        "at 0.05; refit with the plan's tail at 0.5 on the 12 splits with turning_volatile: 0.01 "
        "against none, 0.001, 0.03 and 0.1 (21 of 24 replays cheaper than Knative, tied with "
        f"0.03, which cost 0.001 more; {_TENTH})"
    ),
    "PolicyConfig.rate_window_s": (
        "validation splits only, seed 0, interpolated replay: 30 s against the tick's own "
        "10 s count"
    ),
    "ForecastConfig.carry_window_s": (
        "validation splits only, seed 0, interpolated replay: 60 s against the level window "
        "(autoscaling_validation_frontier.json)"
    ),
    "PolicyConfig.trend_window_s": (
        "validation splits only: the four shapes' rolling origins and the shared traces' "
        "training week (train 1-5, judge 6-7), seed 0, interpolated replay; 120/180/300 s "
        "and off compared, 180 s cheapest with T1 on all ten; with the queue margin 120 s "
        "again cost more (0.917 against 0.911 of the oracle's, "
        "autoscaling_validation_frontier_trend_tail.json)"
    ),
    "HeadroomConfig.score_window_s": (
        "validation splits only (the four shapes' rolling origins and the shared traces' "
        "training week), seed 0, interpolated replay: GPU-hours to 99.5% against Knative "
        "(autoscaling_validation_frontier.json); 30 s (three ticks) against each 10 s count "
        "alone, not tuned further"
    ),
    "HeadroomConfig.score_training_windows": (
        "validation splits only, seed 0, interpolated replay "
        "(autoscaling_validation_frontier.json): off against on"
    ),
    "PolicyConfig.protections_fit_at_cold_start_s": (
        "validation splits only (12), seeds 0 and 1, interpolated replay with the measured cold "
        "starts (cold_start_cpu.json: p95 52.4 s): off kept against 120 s. With the trend's "
        "window kept (scaled_with_cold_start's default) 120 s reaches 99.5% cheaper on 24 of 24 "
        "replays (0.899 against 0.905 of the oracle's GPU-hours) and beats Knative on 18 against "
        "12, but the rule ranks T3a's interval first: above 0 for off, spanning 0 for 120 s "
        "(autoscaling_validation_frontier_sixteenth_ranked.json). At 120 s starts the two are "
        "the same policy"
    ),
    "PolicyConfig.scaled_with_cold_start": (
        "validation splits only (12), seeds 0 and 1, measured cold starts: without the trend's "
        "window against with it, which cost more on 24 of 24 replays (0.910 against 0.899 of "
        "the oracle's GPU-hours to 99.5%; autoscaling_validation_frontier_sixteenth_ranked.json)"
    ),
    "PolicyConfig.target_utilization": "not fit: R6's safety factor (0.7-0.85)",
    "PolicyConfig.panic_queue_fraction": "not fit: half the TTFT SLO",
    "PolicyConfig.panic_hold_s": "not fit: Knative's 60 s panic window",
    "PolicyConfig.panic_drain_s": "not fit: a quarter of a 120 s cold start",
}
