"""The autoscaling policy's defaults that cluster.yaml's `controller` section also exposes.

The replay builds autoscaling.policy_config.PolicyConfig directly; a live app builds it from
serving/config's ControllerSection. Both take these values, so a default refit on the validation
splits (autoscaling/fit_on.FIT_ON says on what) is written once and the live policy runs
what was validated. Here in common/ because serving/config may import only common/.
"""

from __future__ import annotations

LEAD_S = 900.0  # the forecast's lead when no cold start was measured
COLD_START_MARGIN_S = 60.0  # added to the measured p95 cold start
STABILIZATION_WINDOW_S = 60.0  # scale-down takes the highest recommendation over this window
TARGET_UTILIZATION = 0.85  # R6's safety factor, before the headroom is learned
QUEUE_TAIL_SHARE = 0.5  # the plan's queue margin (autoscaling/policy.queue_margin_rps)
SCALE_DOWN_TAIL_SHARE = 0.01  # the scale-down band (autoscaling/policy._scale_down_band)
# the plan's time protections shrink with a measured p95 start shorter than this (0: fixed)
PROTECTIONS_FIT_AT_COLD_START_S = 0.0
