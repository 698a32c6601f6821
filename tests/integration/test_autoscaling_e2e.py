"""The forecast controller end to end: a compressed day on a real local Ray cluster, over HTTP.

The controller (autoscaling/controller.py) is started by build_app from the `controller:` section,
scales the cold pool through Serve's external scaling API and plays the day at time_scale = 300
(one model hour = 12 real seconds). Its history file is injected first, as a controller that ran
on the three previous days would have left it: the forecaster's daily profile (a ramp at 12:00 to
a peak until 14:00) and one cold start of 8 s measured earlier. A client drives HTTP traffic along
the same day shape. The test shows: cold replicas are running BEFORE the ramp begins, the cold
pool stays up through the peak and reaches its maximum, it is released after the peak, no request
fails, the cold start measured today feeds the lead time, and a restarted controller keeps its
forecast (and `python -m autoscaling status` prints it).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import subprocess
import sys
import threading
import time

import httpx
import pytest

from serving.tiny_models import save_tiny_model_dir
from tests.integration.test_serve_app import app_args

pytestmark = pytest.mark.integration

APP = "autoscale-e2e"
PORT = 18500
DAY_S = 86400.0
TIME_SCALE = 300.0
START_S = 20_000 * DAY_S + 10.5 * 3600  # model clock: 10:30 UTC on day 20000
END_HOUR = 16.5
BASE_RPS, PEAK_RPS = 0.5, 3.0
PAST_COLD_START_S = 8.0  # real seconds, "measured yesterday"
MARGIN_S = 1800.0  # model seconds added to the p95 cold start


def day_rate_rps(t_model_s: float) -> float:
    """Requests per real second at a model time: base, ramp 12:00-12:30, peak until 14:00."""
    h = (t_model_s % DAY_S) / 3600.0
    if h < 12.0 or h >= 14.5:
        return BASE_RPS
    if h < 12.5:
        return BASE_RPS + (PEAK_RPS - BASE_RPS) * (h - 12.0) / 0.5
    if h < 14.0:
        return PEAK_RPS
    return PEAK_RPS - (PEAK_RPS - BASE_RPS) * (h - 14.0) / 0.5


def hour(t_model_s: float) -> float:
    return (t_model_s % DAY_S) / 3600.0


def write_past_days(path, cold_start_s: float = PAST_COLD_START_S) -> None:
    from autoscaling.forecast import Forecaster
    from autoscaling.history_store import History, save_history

    forecaster = Forecaster()
    day0 = START_S - (START_S % DAY_S)
    t = day0 - 3 * DAY_S
    while t < day0:
        forecaster.observe(t, day_rate_rps(t))
        t += 120.0
    save_history(
        path,
        History(forecaster=forecaster.to_dict(), cold_start_samples_s=[cold_start_s]),
    )


def controller_section(history_path) -> dict:
    return {
        "app_name": APP,
        "interval_s": 2.0,  # ten model minutes a tick
        "time_scale": TIME_SCALE,
        "clock_start_s": START_S,
        "history_path": str(history_path),
        "replica_capacity_rps": 1.5,  # peak 3 rps -> 3 replicas (1 hot + 2 cold); base -> hot only
        "target_utilization": 0.85,
        "cold_start_margin_s": MARGIN_S,
        # Four ticks: a dip of the forecast just before the ramp must not cancel the pre-warm
        # (with two ticks it did on a loaded machine, and the cold pool flapped 2 -> 1 -> 2).
        "stabilization_window_s": 2400.0,
    }


@pytest.fixture(scope="module")
def day_app(ray_cluster, tmp_path_factory):
    from ray import serve

    from serving.app import build_app

    tmp = tmp_path_factory.mktemp("autoscale")
    model_dir = save_tiny_model_dir(tmp / "tiny", arch="qwen2", seed=7)
    history = tmp / "history.json"
    write_past_days(history)
    args = app_args(model_dir)
    args["pools"] = {
        "hot": {"num_replicas": 1},
        "cold": {"min_replicas": 0, "max_replicas": 2, "initial_replicas": 0},
    }
    args["controller"] = controller_section(history)
    # This test is about the forecast path. A generous TTFT SLO keeps the emergency (queue wait >
    # half the SLO) out of it on a CI machine whose CPUs other jobs share; policy unit tests
    # cover the emergency.
    args["tiers"] = {"interactive": {"ttft_p99_s": 10.0}}
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(args), name=APP, route_prefix="/e2e", external_scaler_enabled=True)
    yield {"base": f"http://127.0.0.1:{PORT}/e2e", "history": history}
    import ray

    from autoscaling.controller import get_controller

    serve.delete(APP)
    with contextlib.suppress(ValueError):
        ray.kill(get_controller(APP), no_restart=True)
    serve.shutdown()


def controller_status(timeout_s: float = 30.0) -> dict:
    import ray

    from autoscaling.controller import get_controller

    return ray.get(get_controller(APP).status.remote(), timeout=timeout_s)


def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = predicate()
        except Exception as err:  # the actor is restarting
            seen = err
        if seen and not isinstance(seen, Exception):
            return seen
        time.sleep(0.5)
    raise TimeoutError(f"{what}; last seen: {seen!r}"[:3000])


class DayClient:
    """Open-loop HTTP client: arrivals follow day_rate_rps of the controller's model clock."""

    def __init__(self, base: str, clock: dict) -> None:
        self.url = base + "/v1/completions"
        self.clock = clock
        self.results: list[int | str] = []
        self.stop = threading.Event()
        self.pool = cf.ThreadPoolExecutor(16)
        self.http = httpx.Client(timeout=30)

    def model_now(self) -> float:
        c = self.clock
        return c["start_s"] + (time.time() - c["wall0_s"]) * c["time_scale"]

    def _one(self, i: int) -> None:
        body = {"model": "tiny", "prompt": "def main():", "max_tokens": 4, "temperature": 0}
        # Every third request is analytical: it tries cold first, so cold replicas serve real
        # traffic at the peak and their release must drain it.
        tier = "analytical" if i % 3 == 0 else "interactive"
        sent_hour = hour(self.model_now())
        try:
            r = self.http.post(self.url, json=body, headers={"x-priority": tier})
            ok = r.status_code == 200
            self.results.append(200 if ok else f"{r.status_code} {r.text[:120]}")
        except Exception as err:  # a timeout is a failure: no request here needs seconds
            self.results.append(f"FAILED {tier} sent at {sent_hour:.2f} h: {err!r}"[:200])

    def run(self) -> None:
        next_s, i = time.monotonic(), 0
        while not self.stop.is_set():
            self.pool.submit(self._one, i)
            i += 1
            next_s += 1.0 / day_rate_rps(self.model_now())
            self.stop.wait(max(0.0, next_s - time.monotonic()))

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.close()


def test_compressed_day_cold_pool_up_before_ramp_and_released_after(day_app):
    from autoscaling.serve_io import read_counts

    status = wait_until(
        lambda: (s := controller_status()) and s["clock"] is not None and s, 180, "no clock"
    )
    assert status["restored_history"] is True  # the injected past days
    client = DayClient(day_app["base"], status["clock"])
    thread = threading.Thread(target=client.run)
    thread.start()
    samples = []  # (model hour, hot running, cold running, cold live)
    try:
        while hour(client.model_now()) < END_HOUR:
            counts = read_counts(APP)
            samples.append(
                (
                    hour(client.model_now()),
                    counts["hot"].running,
                    counts["cold"].running,
                    counts["cold"].live,
                )
            )
            time.sleep(0.5)
    finally:
        client.stop.set()
        thread.join(timeout=30)
        client.close()
    # (model hour, cold running, cold live) as one string, so a failure shows all of it
    timeline = " ".join(f"{h:.2f}:{c}/{live}" for h, _, c, live in samples)
    timeline += f"\nreasons: {[d['reason'][:90] for d in controller_status()['recent_decisions']]}"

    failures = [r for r in client.results if r != 200]
    assert len(client.results) >= 85, len(client.results)  # about 96 along the day shape
    assert not failures, failures[:5]
    assert all(hot == 1 for _, hot, _, _ in samples)  # hot is fixed

    # The cold replica Serve starts with is released at base load, then the pool comes back up
    # before the ramp at 12:00, never empties during the peak and reaches its maximum (2) in it.
    # (It may dip 2 -> 1 for a tick or two when the blended forecast dips at the ramp; that is
    # the forecaster's behaviour, noted in the issue, not asserted either way here.)
    first_empty = next((i for i, s in enumerate(samples) if s[3] == 0), len(samples))
    up = next((s for s in samples[first_empty:] if s[2] >= 1), None)
    assert up is not None and up[0] < 12.0, timeline
    assert all(s[3] >= 1 for s in samples if 12.0 <= s[0] < 14.0), timeline
    assert max(s[2] for s in samples if 12.5 <= s[0] < 14.0) == 2, timeline
    # Released after the peak, and not before it ended.
    down = next((s for s in samples if s[0] >= 12.5 and s[3] == 0), None)
    assert down is not None and down[0] >= 14.0, timeline
    assert samples[-1][3] == 0, timeline

    status = controller_status()
    decisions = status["recent_decisions"]
    # Today's cold start was measured (requested -> running) and joined yesterday's sample;
    # the lead time of later decisions is its p95 (in model seconds) plus the margin.
    assert len(status["cold_start_samples_s"]) >= 2, status
    p95_model_s = status["cold_start_p95_s"] * TIME_SCALE
    assert decisions[-1]["lead_s"] == pytest.approx(p95_model_s + MARGIN_S), decisions[-1]
    assert any("forecast peak" in d["reason"] for d in decisions)
    assert status["apply_path"].startswith("Serve controller")  # no dashboard in tests


def test_restarted_controller_keeps_its_forecast(day_app):
    import ray

    from autoscaling.controller import get_controller

    before = controller_status()
    ray.kill(get_controller(APP), no_restart=False)  # max_restarts=-1: Ray starts it again

    seen: list[dict] = []

    def restarted():
        s = controller_status()
        seen[:] = [{k: s[k] for k in ("started_wall_s", "restored_history", "last", "errors")}]
        new = s["started_wall_s"] > before["started_wall_s"]
        return s if new and s["restored_history"] and s["last"].get("state") == "running" else None

    try:
        after = wait_until(restarted, 120, "no restart")
    except TimeoutError as err:
        raise AssertionError(f"controller did not come back: {err}; last status {seen}") from None
    # Its compressed clock resumes where the saved history left it (after the release, which
    # saved it), not at 10:30 again, and the forecast is the learned profile.
    assert hour(after["clock"]["start_s"]) > 14.0, after["clock"]
    assert "profile" in after["last"]["forecast"]["basis"], after["last"]
    assert len(after["cold_start_samples_s"]) == len(before["cold_start_samples_s"])

    # `python -m autoscaling status` from another driver prints forecast, targets and reasons.
    address = ray.get_runtime_context().gcs_address  # this cluster, not "auto" (shared machine)
    proc = subprocess.run(
        [sys.executable, "-m", "autoscaling", "status", "--app", APP, "--address", address],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "forecast " in proc.stdout and "peak" in proc.stdout, proc.stdout
    assert "targets       {'hot': 1, 'cold': 0}" in proc.stdout, proc.stdout
    assert "last reasons:\n  - cold" in proc.stdout, proc.stdout
