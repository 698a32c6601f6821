"""The `tideserve` console command; the code lives in serving/, capacity/ and autoscaling/."""
