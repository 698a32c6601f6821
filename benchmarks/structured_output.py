"""Structured output on the embedded model: validity of constrained replies, and what the
grammar masks cost the rest of the batch.

1. validity: 50 chat prompts with a JSON schema (response_format json_schema), and 50 with
   tool_choice required; each reply must validate against the schema / parse into a call to
   the named tool with valid arguments;
2. throughput: one mixed load where 25% of the requests are constrained (json_schema), against
   the same prompts all unconstrained, in the same run; output tokens/s of each and the ratio.

Everything runs in one process through the engine (LLMEngine, the same sampler, grammar and
tool code the server uses); the HTTP path is covered by tests/integration/test_openai_surface.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks._common import log, machine_info, write_json
from serving.api import openai as p
from serving.api.http import validate
from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.sampling_params import GrammarSpec
from serving.llm import tools

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun"]
CITIES = ["Paris", "Lagos", "Lima", "Oslo", "Pune", "Quito", "Rome", "Seoul", "Tunis", "Ulm"]


def chat_ids(engine: LLMEngine, req: p.ChatCompletionRequest, plan) -> list[int]:
    tok = engine.tokenizer
    turns = tools.render_turns(req.messages, plan, "tools" in (tok.chat_template or ""))
    text = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False).input_ids)


def person_prompts(n: int) -> list[str]:
    return [
        f"Make up a person named {NAMES[i % 10]} who lives in {CITIES[(3 * i) % 10]}; "
        f"give their age and up to three hobbies as JSON. (#{i})"
        for i in range(n)
    ]


def check_json_schema(engine: LLMEngine, n: int, temperature: float) -> dict:
    spec = GrammarSpec("json_schema", json.dumps(PERSON))
    prompts = []
    for text in person_prompts(n):
        req = validate(p.ChatCompletionRequest, {"messages": [{"role": "user", "content": text}]})
        prompts.append(chat_ids(engine, req, None))
    params = [
        SamplingParams(max_tokens=160, temperature=temperature, seed=i, grammar=spec)
        for i in range(n)
    ]
    outs = engine.generate(prompts, params)
    valid, failures = 0, []
    for out in outs:
        try:
            jsonschema.validate(json.loads(out.text), PERSON)
            valid += 1
        except (json.JSONDecodeError, jsonschema.ValidationError) as err:
            failures.append({"text": out.text[:200], "error": str(err)[:200]})
    return {"prompts": n, "valid": valid, "failures": failures[:5], "example": outs[0].text}


def check_tool_required(engine: LLMEngine, n: int, temperature: float) -> dict:
    parsed, failures, example = 0, [], None
    reqs = []
    for i in range(n):
        body = {
            "messages": [{"role": "user", "content": f"What is the weather in {CITIES[i % 10]}?"}],
            "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
        reqs.append(validate(p.ChatCompletionRequest, body))
    plans = [tools.plan_for(r) for r in reqs]
    params = [
        SamplingParams(max_tokens=120, temperature=temperature, seed=i, grammar=grammar)
        for i, grammar in enumerate(tools.grammar_for(pl) for pl in plans)
    ]
    prompts = [chat_ids(engine, r, pl) for r, pl in zip(reqs, plans, strict=True)]
    outs = engine.generate(prompts, params)
    schema = WEATHER["function"]["parameters"]
    for out, plan in zip(outs, plans, strict=True):
        stream = tools.ToolStream(plan)
        calls = [c for c in stream.feed(out.text) + stream.finish() if isinstance(c, tools.Call)]
        try:
            assert calls and all(c.name == "get_weather" for c in calls), "no call to get_weather"
            for c in calls:
                jsonschema.validate(json.loads(c.arguments), schema)
            parsed += 1
            example = example or {"name": calls[0].name, "arguments": calls[0].arguments}
        except (AssertionError, jsonschema.ValidationError, json.JSONDecodeError) as err:
            failures.append({"text": out.text[:200], "error": str(err)[:200]})
    return {"prompts": n, "parsed": parsed, "failures": failures[:5], "example": example}


def load_run(engine: LLMEngine, prompts, params) -> dict:
    engine.step_log.clear()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    steps = list(engine.step_log)
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "steps": len(steps),
        "step_ms_mean": 1e3 * sum(s.step_s for s in steps) / max(1, len(steps)),
        "forward_ms_mean": 1e3 * sum(s.forward_s for s in steps) / max(1, len(steps)),
    }


def throughput(engine: LLMEngine, n: int, max_tokens: int) -> dict:
    """Same prompts twice: all free, then every 4th constrained. Free rows ignore EOS so their
    length is max_tokens in both runs; constrained rows stop when their JSON is complete."""
    prompts = []
    for text in person_prompts(n):
        req = validate(p.ChatCompletionRequest, {"messages": [{"role": "user", "content": text}]})
        prompts.append(chat_ids(engine, req, None))
    spec = GrammarSpec("json_schema", json.dumps(PERSON))
    free = [
        SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i, ignore_eos=True)
        for i in range(n)
    ]
    mixed = [
        SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i, grammar=spec)
        if i % 4 == 0
        else free[i]
        for i in range(n)
    ]
    engine.generate(prompts[:2], free[:2])  # warm-up (allocator, tokenizer tables)
    engine.grammars.check(spec)
    log("throughput: unconstrained run")
    base = load_run(engine, prompts, free)
    log(f"  {base['tokens_per_s']:.1f} tok/s")
    log("throughput: 25% constrained run")
    mix = load_run(engine, prompts, mixed)
    log(f"  {mix['tokens_per_s']:.1f} tok/s")
    return {
        "num_requests": n,
        "constrained_fraction": 0.25,
        "max_tokens": max_tokens,
        "unconstrained": base,
        "mixed_25pct_constrained": mix,
        "ratio_tokens_per_s": mix["tokens_per_s"] / base["tokens_per_s"],
        "ratio_step_time": base["step_ms_mean"] / mix["step_ms_mean"],
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 prompts per check, 16 requests")
    ap.add_argument("--json", metavar="PATH", help="write the result object here")
    ap.add_argument("--dtype", default="auto", help="EngineConfig.dtype (auto: bf16 if fast)")
    ap.add_argument("--temperature", type=float, default=0.7)
    return ap.parse_args()


def main() -> None:
    from serving.model_source import resolve_model_dir

    args = parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    n_check = 10 if args.quick else 50
    n_load = 16 if args.quick else 48
    cfg = EngineConfig(dtype=args.dtype, max_model_len=1024, max_num_seqs=16, kv_mode="on_demand")
    engine = LLMEngine.from_pretrained(resolve_model_dir("embedded"), cfg)
    log(f"embedded model loaded: {engine.dtype} on {engine.device}")
    report = {
        "benchmark": "structured_output",
        "model": "SmolLM2-135M-Instruct (embedded)",
        "machine": machine_info(str(engine.device), str(engine.dtype)),
        "temperature": args.temperature,
    }
    log(f"json_schema validity: {n_check} prompts")
    report["json_schema"] = check_json_schema(engine, n_check, args.temperature)
    log(f"  valid {report['json_schema']['valid']}/{n_check}")
    log(f"tool_choice named/required: {n_check} prompts")
    report["tool_required"] = check_tool_required(engine, n_check, args.temperature)
    log(f"  parsed {report['tool_required']['parsed']}/{n_check}")
    report["throughput"] = throughput(engine, n_load, max_tokens=96)
    log(f"ratio (mixed / unconstrained tok/s): {report['throughput']['ratio_tokens_per_s']:.3f}")
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=2))
    if args.json:
        write_json(args.json, report)
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
