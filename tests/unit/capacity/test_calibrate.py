import math

import pytest

from capacity.calibrate import (
    Fit,
    Profile,
    StepPoint,
    calibrate,
    fit_step_model,
    predict_closed_loop,
)
from capacity.planner import throughput_from_profile


def _synthetic(a=2e-3, b=5e-5, c=3e-7):
    pts = []
    for tokens in (1, 4, 16, 64, 256, 512):
        for kv in (10, 300, 5000, 20000):
            pts.append(StepPoint(4, tokens, kv, a + b * tokens + c * kv))
    return pts


def _profile(a=2e-3, b=5e-5, c=1e-8):
    fit = Fit(a=a, b=b, c=c, r2=1.0, rms_rel_residual=0.0, max_abs_rel_residual=0.0, num_points=3)
    return Profile(device="cpu:test", dtype="float32", model={"hidden_size": 8}, fit=fit)


def test_fit_recovers_known_coefficients():
    fit = fit_step_model(_synthetic())
    assert fit.a == pytest.approx(2e-3, rel=1e-9)
    assert fit.b == pytest.approx(5e-5, rel=1e-9)
    assert fit.c == pytest.approx(3e-7, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.max_abs_rel_residual < 1e-9
    with pytest.raises(ValueError):
        fit_step_model(_synthetic()[:2])


def test_profile_json_round_trip(tmp_path):
    pts = _synthetic()
    p = Profile(
        device="cpu:x",
        dtype="float32",
        model={"hidden_size": 256, "num_hidden_layers": 4},
        fit=fit_step_model(pts),
        points=tuple(pts),
        settings={"batch_sizes": [1, 4]},
    )
    path = tmp_path / "profile.json"
    p.save(path)
    q = Profile.load(path)
    assert q == p
    assert q.predict_step_s(16, 300) == pytest.approx(2e-3 + 5e-5 * 16 + 3e-7 * 300)


def test_throughput_from_profile_monotonic_in_concurrency():
    prof = _profile()
    prev = 0.0
    for c in (1, 2, 4, 8, 16, 32, 64, 128):
        tok, req, step = throughput_from_profile(prof, c, avg_input=128, avg_output=64)
        assert tok > prev
        assert req == pytest.approx(tok / 64)
        assert step > 0
        prev = tok
    with pytest.raises(ValueError):
        throughput_from_profile(prof, 0, 128, 64)
    pred = predict_closed_loop(prof, 16, 128, 64)
    assert pred["quantile_step_s"] >= pred["mean_step_s"]


def test_tiny_real_calibration():
    prof = calibrate("tiny", batch_sizes=(1, 4), context_lens=(16, 32), decode_steps=3)
    f = prof.fit
    assert f.num_points == len(prof.points) >= 3
    assert all(math.isfinite(x) for x in (f.a, f.b, f.c, f.r2))
    assert all(p.step_s > 0 and p.kv_tokens_read >= p.num_tokens for p in prof.points)
    # decode steps at batch 4, context 32 read at least 4 x 33 KV tokens
    assert max(p.kv_tokens_read for p in prof.points) >= 4 * 33
    assert prof.dtype == "float32" and prof.model["hidden_size"] == 256
