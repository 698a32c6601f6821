"""How a `controller:` section shapes the deployments: for Serve's application-level policy
(the default) every deployment gets an autoscaling_config (ingress and hot fixed, cold min..max,
no Serve delays); for the external-scaler option none does and cold starts at >= 1."""

from __future__ import annotations

import pytest

from serving.config import AppConfig

POOLS = {
    "hot": {"num_replicas": 2},
    "cold": {"min_replicas": 0, "max_replicas": 3, "initial_replicas": 0},
}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("initial", [0, 2])
def test_cold_pool_under_the_external_scaler_has_a_fixed_count(initial):
    from serving.app import _cold_options

    pools = {"cold": {"min_replicas": 0, "max_replicas": 3, "initial_replicas": initial}}
    external = {"pools": pools, "controller": {"scaler": "external"}}
    with_ctl = _cold_options(AppConfig.from_args(external))
    # Ray 2.60 refuses external_scaler_enabled with any autoscaling_config, and num_replicas=0.
    assert "autoscaling_config" not in with_ctl
    assert with_ctl["num_replicas"] == max(initial, 1)
    without = _cold_options(AppConfig.from_args({"pools": pools}))
    assert ("autoscaling_config" in without) == (initial == 0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_under_the_serve_policy_every_deployment_reports_and_only_cold_moves():
    from ray.serve.config import AutoscalingConfig

    from serving.app import _cold_options, _fixed_size, _ingress_options, _replica_options

    cfg = AppConfig.from_args({"pools": POOLS, "controller": {}})
    assert cfg.controller.scaler == "serve_policy"
    cold = _cold_options(cfg)
    assert "num_replicas" not in cold
    ac = AutoscalingConfig(**cold["autoscaling_config"])  # Serve accepts it as given
    assert (ac.min_replicas, ac.max_replicas, ac.initial_replicas) == (0, 3, 0)
    assert ac.upscale_delay_s == ac.downscale_delay_s == ac.downscale_to_zero_delay_s == 0
    hot = _fixed_size(_replica_options(cfg, "hot", 2, {}), 2)
    ingress = _fixed_size(_ingress_options(cfg), 1)
    for options, n in ((hot, 2), (ingress, 1)):
        fixed = AutoscalingConfig(**options["autoscaling_config"])
        assert fixed.min_replicas == fixed.max_replicas == n and "num_replicas" not in options


def test_an_unknown_scaler_is_refused_by_name():
    with pytest.raises(ValueError, match=r"controller\.scaler='actor'"):
        AppConfig.from_args({"controller": {"scaler": "actor"}})
