"""With a `controller:` section the cold deployment is shaped for Serve's external scaler."""

from __future__ import annotations

import pytest

from serving.config import AppConfig


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("initial", [0, 2])
def test_cold_pool_has_a_fixed_count_and_no_serve_autoscaling_under_the_controller(initial):
    from serving.app import _cold_options

    pools = {"cold": {"min_replicas": 0, "max_replicas": 3, "initial_replicas": initial}}
    with_ctl = _cold_options(AppConfig.from_args({"pools": pools, "controller": {}}))
    # Ray 2.60 refuses external_scaler_enabled with any autoscaling_config, and num_replicas=0.
    assert "autoscaling_config" not in with_ctl
    assert with_ctl["num_replicas"] == max(initial, 1)
    without = _cold_options(AppConfig.from_args({"pools": pools}))
    assert ("autoscaling_config" in without) == (initial == 0)
