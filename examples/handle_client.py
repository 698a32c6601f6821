"""Call tideserve from another Ray program through a DeploymentHandle (no HTTP).

Start the server first (`serve run cluster.yaml`), then, on the same Ray cluster:

    .venv/bin/python examples/handle_client.py
"""

from __future__ import annotations

import ray
from ray import serve


def main() -> None:
    ray.init(address="auto", log_to_driver=False)
    handle = serve.get_app_handle("tideserve")

    out = handle.generate.remote(
        "The capital of France is", max_tokens=12, priority="analytical", temperature=0
    ).result(timeout_s=120)
    print(f"[{out.pool} pool, {out.finish_reason}, {out.usage}]\n{out.text!r}\n")

    print("streaming: ", end="", flush=True)
    stream = handle.options(stream=True).generate_stream.remote(
        "Once upon a time", max_tokens=32, temperature=0.7, seed=1
    )
    for part in stream:
        print(part.text, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
