"""Stream a chat completion from tideserve with the official `openai` client.

serve run cluster.yaml            # in another terminal
.venv/bin/python examples/openai_stream.py "Name three fruits."
"""

from __future__ import annotations

import sys

from openai import OpenAI


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "What is the capital of France?"
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=64,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-priority": "interactive"},
    )
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        elif chunk.usage:
            print(f"\n[{chunk.usage.completion_tokens} tokens]")


if __name__ == "__main__":
    main()
