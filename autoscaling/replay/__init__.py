"""Trace replay: a per-second simulator of a replica fleet, the baselines it compares, its plot.

`python -m autoscaling replay` (or `tideserve replay`) runs it; the tideserve policy inside it is
the same forecaster and `decide()` the live autoscaler runs.
"""
