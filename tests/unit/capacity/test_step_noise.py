"""Step-time jitter model (capacity/step_noise.py) and its use in plan --profile."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capacity import cli
from capacity.calibrate import Fit, Profile, predict_closed_loop
from capacity.step_noise import cell_noise, mixture_quantile, ratios_near
from tests.unit.capacity.test_planner import LLAMA3_8B


def _profile(noise=(), batch_sizes=(1, 4, 16, 32)):
    fit = Fit(
        a=2e-3, b=5e-5, c=1e-8, r2=1.0, rms_rel_residual=0, max_abs_rel_residual=0, num_points=3
    )
    return Profile(
        device="cpu:test",
        dtype="float32",
        model={},
        fit=fit,
        settings={"batch_sizes": list(batch_sizes)},
        noise_samples=tuple(noise),
    )


def test_cell_noise_is_ratio_to_the_cell_median():
    samples = cell_noise([1.0, 2.0, 2.0, 4.0])
    assert [m for m, _ in samples] == [2.0] * 4
    assert [r for _, r in samples] == [0.5, 1.0, 1.0, 2.0]
    assert cell_noise([1.0, 2.0, 3.0]) == []  # too few steps to know the typical one


def test_without_noise_the_quantile_is_the_mixture_of_typical_steps():
    # 98% of steps take 10 ms, 2% take 30 ms: the p99 is a 30 ms step, the p90 a 10 ms one.
    assert mixture_quantile([0.010, 0.030], [0.98, 0.02], (), 0.99) == pytest.approx(0.030)
    assert mixture_quantile([0.010, 0.030], [0.98, 0.02], (), 0.90) == pytest.approx(0.010)
    with pytest.raises(ValueError, match=r"q=1\.5"):
        mixture_quantile([0.01], [1.0], (), 1.5)


def test_noise_scales_each_kind_of_step():
    # every cell scatters uniformly between 1.0x and 1.5x its median
    ratios = np.linspace(1.0, 1.5, 101)
    noise = [(0.010, float(r)) for r in ratios]
    p99 = mixture_quantile([0.010], [1.0], noise, 0.99)
    assert p99 == pytest.approx(0.010 * np.quantile(ratios, 0.99), rel=0.01)


def test_jitter_is_taken_from_cells_of_similar_step_time():
    # short steps jitter by up to 2x, long steps by up to 1.1x: a long step must not borrow
    # the short steps' tail (a millisecond of jitter is not 50% of a 20 ms step).
    short = [(0.002, float(r)) for r in np.linspace(1.0, 2.0, 40)]
    long = [(0.020, float(r)) for r in np.linspace(1.0, 1.1, 40)]
    assert ratios_near(short + long, 0.021).max() == pytest.approx(1.1)
    assert ratios_near(short + long, 0.0019).max() == pytest.approx(2.0)
    p99_long = mixture_quantile([0.020], [1.0], short + long, 0.99)
    assert p99_long <= 0.020 * 1.1 + 1e-9


def test_predicted_p99_grows_with_measured_jitter():
    calm = predict_closed_loop(_profile(), 16, 128, 64)
    noisy = predict_closed_loop(
        _profile([(calm["mean_step_s"], float(r)) for r in np.linspace(0.9, 1.6, 64)]), 16, 128, 64
    )
    assert noisy["quantile_step_s"] > calm["quantile_step_s"] >= calm["mean_step_s"]
    assert noisy["mean_step_s"] == calm["mean_step_s"]  # jitter moves the tail, not the plan


def test_old_profiles_without_noise_still_load(tmp_path):
    path = tmp_path / "p.json"
    d = _profile().to_dict()
    del d["noise_samples"]
    path.write_text(json.dumps(d))
    assert Profile.load(path).noise_samples == ()


def test_plan_profile_concurrency_override(tmp_path, capsys):
    model = tmp_path / "config.json"
    model.write_text(json.dumps(LLAMA3_8B))
    prof = tmp_path / "profile.json"
    _profile(batch_sizes=(1, 8)).save(prof)
    base = ["plan", "--model", str(model), "--gpu", "H100-SXM", "--avg-input", "600"]
    base += ["--avg-output", "120", "--max-model-len", "4096", "--peak-qps", "100"]
    base += ["--profile", str(prof), "--json"]

    assert cli.main([*base, "--concurrency", "8"]) == 0
    at8 = json.loads(capsys.readouterr().out)["profile_throughput"]
    assert at8["concurrency"] == 8 and at8["extrapolated"] is False
    assert at8["p99_step_s"] >= at8["step_s"]

    assert cli.main([*base, "--concurrency", "64"]) == 0
    at64 = json.loads(capsys.readouterr().out)["profile_throughput"]
    assert at64["extrapolated"] is True
    assert at64["raw_tokens_per_s"] > at8["raw_tokens_per_s"]

    assert cli.main([*base, "--concurrency", "0"]) == 2
    assert "--concurrency=0 must be >= 1" in capsys.readouterr().err
