"""The validation protocol of the autoscaling replay: what settings may be fit on, what judges them.

    training    the days a replay learns from (the forecaster, the headroom's first scores, the
                hot pool); every split has them
    validation  rolling origins: train on days 1..t, judge the next days, then move t on
                (synthetic shapes, 14 days: train 1-7 judge 8-10, train 1-10 judge 11-14; the
                shared traces' own training week: train 1-5 judge 6-7). Settings are chosen here.
    test        the shared traces' judged days (train 1-7, judge 8-14). Nothing is tuned on
                them: they only report the targets, with settings fixed before.

`for_tuning` is the gate: a script that compares settings to choose one passes its splits through
it, and a test split is an error naming it. Pure; no replay runs here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoscaling.replay.runner import ReplaySettings

ROLES = ("validation", "test")
SHARED_TRACES = ("m-small", "m-large")
SHARED_TEST_FROM_DAY = 8  # the shared traces' days 8.. are the test set
SHAPE_DAYS = 14  # benchmarks/autoscaling_shapes.py's synthetic series


@dataclass(frozen=True)
class Split:
    source: str  # a shared trace or a synthetic shape
    train_days: int  # days 1..train_days are learned from
    judge_days: int | None  # the days after them that are judged (None: to the end)
    role: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Split.role={self.role!r} is not known; choose from {ROLES}")
        if self.train_days < 1 or (self.judge_days is not None and self.judge_days < 1):
            raise ValueError(
                f"Split {self.source}: train_days={self.train_days}, "
                f"judge_days={self.judge_days}; allowed: >= 1"
            )

    @property
    def label(self) -> str:
        end = "end" if self.judge_days is None else self.train_days + self.judge_days
        first = self.train_days + 1
        return f"{self.source} ({self.role}): train 1-{self.train_days}, judge {first}-{end}"

    def settings(self, base: ReplaySettings) -> ReplaySettings:
        return replace(base, train_days=float(self.train_days), judge_days=self.judge_days)


def rolling_origins(
    source: str, last_day: int, first_train_days: int, step_days: int
) -> list[Split]:
    """Validation splits: train 1..t, judge the next `step_days` (the last one runs to
    `last_day` when fewer than `step_days` would be left after it), t moving by what was judged."""
    if not 1 <= first_train_days < last_day or step_days < 1:
        raise ValueError(
            f"rolling_origins({source}): first_train_days={first_train_days}, "
            f"last_day={last_day}, step_days={step_days}; need 1 <= first < last, step >= 1"
        )
    out, t = [], first_train_days
    while t < last_day:
        judge = step_days if last_day - (t + step_days) >= step_days else last_day - t
        out.append(Split(source, t, judge, "validation"))
        t += judge
    return out


def shared_test_split(trace: str) -> Split:
    """A shared trace's judged days: the test set."""
    return Split(trace, SHARED_TEST_FROM_DAY - 1, None, "test")


def validation_splits(shapes: list[str], shared: tuple[str, ...] = SHARED_TRACES) -> list[Split]:
    """Every validation split: the shapes' rolling origins, and the shared traces' training
    week (train 1-5, judge 6-7), which ends before their test days begin."""
    out = []
    for shape in shapes:
        out += rolling_origins(shape, SHAPE_DAYS, 7, 3)
    for trace in shared:
        out += rolling_origins(trace, SHARED_TEST_FROM_DAY - 1, 5, 2)
    return for_tuning(out)


def for_tuning(splits: list[Split]) -> list[Split]:
    """The splits a choice of settings may be made on; a test split, or a shared trace's split
    that judges any day of its test set, is an error naming it."""
    for sp in splits:
        reaches = None if sp.judge_days is None else sp.train_days + sp.judge_days
        into_test = sp.source in SHARED_TRACES and (
            reaches is None or reaches >= SHARED_TEST_FROM_DAY
        )
        if sp.role == "test" or into_test:
            raise ValueError(
                f"{sp.label} judges the shared traces' test days (day {SHARED_TEST_FROM_DAY} on):"
                " nothing is tuned on them (docs/autoscaling.md, 'The validation protocol')"
            )
    return splits
