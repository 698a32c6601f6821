"""docs/openai.md's field table is what the server does, and covers every OpenAI request field."""

from __future__ import annotations

import pathlib
import re

import pytest

from serving.api import openai as p
from serving.api.errors import ApiError
from serving.api.http import request_tier
from serving.api.openai_fields import IGNORED, REFUSED

ROOT = pathlib.Path(__file__).resolve().parents[3]
ROW = re.compile(r"^\| (`[^|]+`) \| (honoured|refused|ignored) \| [^|]+ \| ([^|]+) \|$")


def table() -> dict[str, tuple[str, list[str]]]:
    """field -> (status, tests that show it), from every table row of docs/openai.md."""
    rows: dict[str, tuple[str, list[str]]] = {}
    for line in (ROOT / "docs" / "openai.md").read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            tests = re.findall(r"`(test_\w+)`", match[3])
            for field in re.findall(r"`(\w+)`", match[1]):
                rows[field] = (match[2], tests)
    return rows


def test_every_openai_sdk_request_field_is_in_the_table():
    from openai.types import completion_create_params as completion
    from openai.types.chat import completion_create_params as chat

    documented = set(table()) | {"stream"}
    for params in (chat.CompletionCreateParamsBase, completion.CompletionCreateParamsBase):
        missing = set(params.__annotations__) - documented
        assert not missing, f"fields of the openai SDK not in docs/openai.md: {sorted(missing)}"


def test_the_table_says_what_the_code_does():
    rows = table()
    status = {f: s for f, (s, _) in rows.items()}
    assert {f for f, s in status.items() if s == "refused"} == set(REFUSED)
    assert {f for f, s in status.items() if s == "ignored"} == set(IGNORED)
    honoured = set(p.ChatCompletionRequest.model_fields) | set(p.CompletionRequest.model_fields)
    assert {f for f, s in status.items() if s == "honoured"} == honoured


def test_every_test_the_table_names_exists():
    names = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    for field, (_, tests) in table().items():
        assert tests, f"{field} names no test"
        assert set(tests) <= names, f"{field}: no such test {sorted(set(tests) - names)}"


def test_request_tier_order():
    assert request_tier(None, None) == "interactive"
    assert request_tier(None, None, default_tier="analytical") == "analytical"
    assert request_tier(None, None, "auto", "analytical") == "analytical"
    assert request_tier(None, "offline", "default", "analytical") == "offline"  # header > auto
    assert request_tier(None, "offline", "priority") == "interactive"  # a lane > header
    assert request_tier(None, None, "flex") == "offline"
    assert request_tier(2, None, "priority") == "offline"  # priority > service_tier
    assert [request_tier(i, None) for i in (-5, 0, 1, 2, 9)] == [
        "interactive",
        "interactive",
        "analytical",
        "offline",
        "offline",
    ]
    assert request_tier("analytical", "offline") == "analytical"
    for args, needle in [(("vip", None), "priority='vip'"), ((None, "vip"), "x-priority='vip'")]:
        with pytest.raises(ApiError, match=needle):
            request_tier(*args)


def test_service_tier_default_is_interactive_or_analytical():
    from serving.config.sections import ServerSection

    assert ServerSection().service_tier_default == "interactive"
    assert ServerSection(service_tier_default="analytical").service_tier_default == "analytical"
    with pytest.raises(ValueError, match=r"server.service_tier_default='offline' is not allowed"):
        ServerSection(service_tier_default="offline")
