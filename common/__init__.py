"""What every package shares and nothing else: config-field checks, one percentile, the tiers.

Pure Python (no torch, no Ray), so `capacity`, `autoscaling` and `serving` can all import it
without importing each other.
"""
