"""Tool calls: tools into the prompt, a grammar for forced calls, tool_calls out of the text.

The call format is the Hermes one that Qwen2.5, Hermes and SmolLM3 were trained on:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A chat template that renders `tools` itself gets them as `tools=`; one that does not (the
embedded SmolLM2's) gets a system message describing the tools and this format. tool_choice
`required` or a named function decodes under a grammar: one call (or, with parallel_tool_calls,
up to MAX_PARALLEL_CALLS) whose arguments follow the function's JSON schema, so the reply always
parses. `auto` lets the model choose and parses any complete calls out of its text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from serving.api import openai as p
from serving.engine.grammar import JSON_STYLE
from serving.engine.sampling_params import GrammarSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_PARALLEL_CALLS = 4


@dataclass(frozen=True, slots=True)
class ToolPlan:
    mode: str  # "auto" | "required" | "named"
    functions: tuple[p.Tool, ...]  # those the model may call (named: just that one)
    all_functions: tuple[p.Tool, ...]  # those described in the prompt
    parallel: bool

    @property
    def forced(self) -> bool:
        return self.mode != "auto"

    def names(self) -> set[str]:
        return {t.function.name for t in self.functions}


def plan_for(req: p.ChatCompletionRequest) -> ToolPlan | None:
    """None when no tool may be called (no tools, or tool_choice none)."""
    if not req.calls_tools:
        return None
    tools = tuple(req.tools or ())
    choice = req.tool_choice or "auto"
    if isinstance(choice, p.NamedToolChoice):
        named = tuple(t for t in tools if t.function.name == choice.function.name)
        return ToolPlan("named", named, tools, bool(req.parallel_tool_calls))
    # OpenAI's default for parallel_tool_calls is true.
    return ToolPlan(choice, tools, tools, req.parallel_tool_calls is not False)


def _call_schema(tool: p.Tool) -> dict:
    params = dict(tool.function.parameters) or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def grammar_for(plan: ToolPlan) -> GrammarSpec | None:
    """The Lark grammar of a forced call; None for auto (the model may answer in text)."""
    if not plan.forced:
        return None
    schemas = [_call_schema(t) for t in plan.functions]
    body = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    body = {**body, "x-guidance": JSON_STYLE}
    repeat = f'("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if plan.parallel else ""
    lark = (
        f"start: call {repeat}\n"
        f'call: "{OPEN}\\n" body "\\n{CLOSE}"\n'
        f"body: %json {json.dumps(body)}\n"
    )
    return GrammarSpec("lark", lark)


def system_text(plan: ToolPlan) -> str:
    """What a template without tool support is told (in a system message)."""
    lines = [
        json.dumps(
            {
                "name": t.function.name,
                "description": t.function.description or "",
                "parameters": t.function.parameters,
            }
        )
        for t in plan.all_functions
    ]
    must = {
        "auto": "Call a function only when it helps; otherwise answer in text.",
        "required": "You must call a function.",
        "named": f"You must call the function {next(iter(plan.names()))}.",
    }[plan.mode]
    return (
        "You can call these functions:\n" + "\n".join(lines) + "\nTo call a function, answer "
        f'with\n{OPEN}\n{{"name": <function name>, "arguments": <JSON object>}}\n{CLOSE}\n{must}'
    )


def call_text(name: str, arguments: object) -> str:
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def render_turns(messages: list[p.ChatMessage], plan: ToolPlan | None, native: bool) -> list:
    """Turns for apply_chat_template. `native`: the template renders tools and tool_calls."""
    turns = []
    for m in messages:
        turn: dict = {"role": m.role, "content": m.text()}
        if m.name is not None:
            turn["name"] = m.name
        if m.tool_call_id is not None:
            turn["tool_call_id"] = m.tool_call_id
        calls = m.tool_calls or []
        if calls and native:
            turn["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": c.function.arguments_object(),
                    },
                }
                for c in calls
            ]
        elif calls:  # the template would drop them: write them as the model would have
            texts = [call_text(c.function.name, c.function.arguments_object()) for c in calls]
            turn["content"] = "\n".join([turn["content"], *texts]).strip()
        turns.append(turn)
    if plan is not None and not native:
        if turns[0]["role"] in ("system", "developer"):
            turns[0] = {**turns[0], "content": turns[0]["content"] + "\n\n" + system_text(plan)}
        else:
            turns.insert(0, {"role": "system", "content": system_text(plan)})
    return turns


def tools_kwarg(plan: ToolPlan | None) -> list[dict] | None:
    if plan is None:
        return None
    return [t.model_dump(exclude_none=True) for t in plan.all_functions]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    name: str
    arguments: str  # a JSON object, serialised, as OpenAI sends it


def parse_call(body: str, names: set[str]) -> Call | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    return Call(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False))


class ToolStream:
    """Splits generated text into content and complete calls, as it streams in.

    Text that might be the start of `<tool_call>` is held back until it is clearly not; a call
    is emitted once its closing tag arrives. A forced plan emits no content at all."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.names = plan.names()
        self.buf = ""
        self.inside = False
        self.calls: list[Call] = []

    def feed(self, text: str) -> list[str | Call]:
        self.buf += text
        out: list[str | Call] = []
        while True:
            if not self.inside:
                i = self.buf.find(OPEN)
                if i < 0:
                    keep = _partial_tag(self.buf)
                    self._content(out, self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                self._content(out, self.buf[:i])
                self.buf, self.inside = self.buf[i + len(OPEN) :], True
            j = self.buf.find(CLOSE)
            if j < 0:
                return out
            body, self.buf, self.inside = self.buf[:j], self.buf[j + len(CLOSE) :], False
            call = parse_call(body, self.names)
            if call is None:
                self._content(out, OPEN + body + CLOSE)
            else:
                self.calls.append(call)
                out.append(call)

    def finish(self) -> list[str | Call]:
        rest = (OPEN if self.inside else "") + self.buf
        self.buf, self.inside = "", False
        out: list[str | Call] = []
        self._content(out, rest)
        return out

    def _content(self, out: list, text: str) -> None:
        if text and not self.plan.forced:
            out.append(text)


def _partial_tag(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of OPEN."""
    for n in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
