"""Which OpenAI request fields the server honours, which it refuses, which it ignores on purpose.

Every field of OpenAI's chat-completions and completions requests is in exactly one place:
a typed field of the request models (serving/api/openai.py, honoured), REFUSED (a 400 naming it
unless its value is null or the harmless default listed), or IGNORED (identifiers and cache
hints that change nothing in the output). Anything else is an unknown field: a 400 naming it.
docs/openai.md has the same table for users; tests/unit/api/test_openai_fields.py keeps them equal.
"""

from __future__ import annotations

from typing import Any

from serving.api.errors import ApiError

# field -> (values accepted as "not asking for it", why it is refused)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "audio": ((None,), "audio output is not supported; this server generates text"),
    "modalities": ((None, ["text"]), "only the text modality is supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "the served model is not a reasoning model"),
    "verbosity": ((None,), "verbosity is not supported"),
    "web_search_options": ((None,), "web search is not supported"),
    "moderation": ((None,), "moderation is not supported"),
    "functions": ((None,), "the deprecated `functions` is not supported; send `tools`"),
    "function_call": ((None,), "the deprecated `function_call` is not supported; `tool_choice`"),
    "store": ((None, False), "stored completions are not supported (store must be false)"),
    "suffix": ((None, ""), "suffix (insertion) is not supported"),
}

# Accepted and ignored: they identify the caller or hint at a provider-side cache, and change
# nothing in what is generated.
IGNORED: dict[str, str] = {
    "user": "an end-user id for abuse monitoring; nothing here uses it",
    "safety_identifier": "an end-user id for abuse monitoring; nothing here uses it",
    "metadata": "tags for stored completions; nothing is stored",
    "prompt_cache_key": "a hint for the provider's prompt cache; there is none to steer",
    "prompt_cache_retention": "a hint for the provider's prompt cache; there is none to steer",
    "prompt_cache_options": "a hint for the provider's prompt cache; there is none to steer",
}


def check_fields(body: Any, known: set[str], where: str = "") -> Any:
    """Refuse unknown fields and fields we do not implement, naming them; drop IGNORED ones."""
    if not isinstance(body, dict):
        return body
    for name, value in body.items():
        if name in REFUSED:
            accepted, why = REFUSED[name]
            if value not in accepted:
                raise ApiError(400, f"{where}{name}: {why}", param=f"{where}{name}")
        elif name not in known and name not in IGNORED:
            allowed = sorted(known | set(IGNORED))
            raise ApiError(
                400,
                f"{where}{name}: unknown field; this server accepts {allowed}",
                param=f"{where}{name}",
            )
    return {k: v for k, v in body.items() if k in known}


def refuse_extra(body: Any, known: set[str], where: str) -> Any:
    """For nested objects (a message, a tool): unknown keys are a 400 naming the path."""
    if isinstance(body, dict):
        for name in body:
            if name not in known:
                raise ApiError(
                    400,
                    f"{where}.{name}: unknown field; allowed: {sorted(known)}",
                    param=f"{where}.{name}",
                )
    return body
