"""docs/configuration.md is generated from the config classes and must match them.

A new config key, a changed default, range or comment makes the committed page stale; regenerate
it with `python scripts/gen_config_reference.py`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "scripts" / "gen_config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
SECTIONS = gen.sections()


def test_committed_reference_is_current():
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == gen.render(), (
        "docs/configuration.md is stale: run `python scripts/gen_config_reference.py` and commit it"
    )


def test_every_section_of_app_config_is_listed():
    paths = [s.path for s in SECTIONS]
    assert paths == [
        "model",
        "engine",
        "tiers.<tier>",
        "pools.hot",
        "pools.cold",
        "replica",
        "server",
        "controller",
        "controller.lead_overrides[]",
        "dynamic_batching",
        "batch_api",
    ]
    for section in SECTIONS:
        assert [k.name for k in section.keys] == [f.name for f in dataclasses.fields(section.cls)]
        assert all(k.description for k in section.keys)


def test_a_bound_that_follows_another_field_is_named():
    engine = {k.name: k for k in next(s for s in SECTIONS if s.path == "engine").keys}
    assert engine["min_num_seqs"].allowed == ["[1, max_num_seqs]"]
    assert engine["kv_high_watermark"].allowed == ["[kv_low_watermark, 1]"]
    assert engine["kv_mode"].allowed == ["one of `reserve`, `on_demand`"]


INTERVAL = re.compile(r"^([\[(])(-?[0-9.e+]+), ")


def _lower_bound_cases():
    for section in SECTIONS:
        instance = gen.SAMPLES.get(section.cls) or section.cls()
        for key in section.keys:
            for text in key.allowed:
                match = INTERVAL.match(text)
                if match:
                    yield section.path, instance, key.name, match[1] == "(", float(match[2])


@pytest.mark.parametrize(
    ("path", "instance", "name", "open_", "lo"),
    list(_lower_bound_cases()),
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_documented_lower_bound_is_enforced(path, instance, name, open_, lo):
    """The page's ranges are the ones the classes enforce: just below each one is refused."""
    current = getattr(instance, name)
    is_int = isinstance(current, int) or (current is None and lo.is_integer() and not open_)
    below = lo if open_ else (int(lo) - 1 if is_int else lo - 1e-3)
    with pytest.raises(ValueError, match=name):
        dataclasses.replace(instance, **{name: below})


@dataclass
class _Commented:
    # the block above
    # spans two lines
    a: int = 1  # and the end of the line
    b: int = 2  # only here
    c: int = 3


def test_descriptions_are_the_comments_beside_each_field():
    assert gen.field_comments(_Commented) == {
        "a": "the block above spans two lines and the end of the line",
        "b": "only here",
        "c": "",
    }
