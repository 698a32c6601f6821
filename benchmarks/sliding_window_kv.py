"""Sliding-window KV: what freeing the blocks outside each window saves.

    python benchmarks/sliding_window_kv.py [--quick] [--json PATH]

1. Derived, for public configs with sliding windows (tests/data/model_configs): the KV one
   sequence holds in the engine's blocks (capacity.memory.seq_blocks x block_bytes, bf16, 16-token
   blocks) with the out-of-window blocks freed and with every block kept, at several lengths; and
   the max concurrency at max_model_len on one H100-80GB with and without freeing (the planner).
2. Measured, on tiny random models of this repository (float32, CPU): the same requests through
   the engine twice, with freeing and with every block kept (one paging group of all layers);
   the peak of blocks in use, and the outputs, which must be identical.
Machine-independent: nothing here is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO_ROOT, log, write_json
from capacity import memory
from capacity.planner import PlanInputs, model_view, plan

CONFIGS = REPO_ROOT / "tests" / "data" / "model_configs"
PUBLIC = ("mistral-7b-v0.1", "phi-3-mini", "gemma-2-9b")
BLOCK = 16


def derived(name: str) -> dict:
    raw = json.loads((CONFIGS / name / "config.json").read_text())
    cfg = model_view(raw)
    windows = memory.paging_layout(cfg).group_windows
    page = memory.block_bytes(cfg, "bf16", BLOCK)
    max_len = int(raw["max_position_embeddings"])
    lengths = sorted({1024, 4096, 8192, max_len} - {n for n in (1024, 4096, 8192) if n > max_len})
    rows = []
    for n in lengths:
        kept = memory.blocks_for_tokens(n, BLOCK) * len(windows) * page
        freed = memory.seq_blocks(windows, n, BLOCK) * page
        rows.append(
            dict(tokens=n, kv_bytes_kept=kept, kv_bytes_freed=freed, saving=1 - freed / kept)
        )
    with_freeing = plan(PlanInputs(raw, "H100-80GB", 600, 120, max_len, 10.0))
    no_windows = plan(
        PlanInputs({**raw, "sliding_window": None}, "H100-80GB", 600, 120, max_len, 10.0)
    )
    return dict(
        model=name,
        group_windows=list(windows),
        page_bytes=page,
        per_sequence=rows,
        max_concurrency_at_max_len_h100=dict(
            max_model_len=max_len,
            freed=with_freeing.max_concurrency_max_len,
            every_block_kept=no_windows.max_concurrency_max_len,
        ),
    )


def _keep_every_block(config):
    shape = config if isinstance(config, memory.KVShape) else memory.KVShape.from_config(config)
    n = shape.num_layers
    return memory.PagingLayout((None,), n, (0,) * n, tuple(range(n)))


def run_engine(arch: str, prompts: list[list[int]], max_tokens: int, keep_all: bool) -> dict:
    from serving.engine import EngineConfig, LLMEngine, SamplingParams
    from serving.tiny_models import tiny_model

    model = tiny_model(arch, seed=0)
    config = EngineConfig(
        num_kv_blocks=4000, block_size_tokens=8, max_num_batched_tokens=128, max_num_seqs=16
    )
    keep = mock.patch.object(memory, "paging_layout", _keep_every_block)
    with keep if keep_all else contextlib.nullcontext():
        engine = LLMEngine(model, config=config)
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        for p in prompts:
            engine.add_request(p, params)
        peak, outs = 0, {}
        while engine.has_unfinished():
            for seq in engine.step():
                if seq.finished:
                    outs[seq.request_id] = seq.output_token_ids
            peak = max(peak, engine.pool.num_used_blocks)
        page = memory.block_bytes(model.config, model.dtype, 8)
    return dict(
        peak_blocks=peak, peak_kv_bytes=peak * page, outputs=[outs[k] for k in sorted(outs)]
    )


def measured(arch: str, quick: bool) -> dict:
    rng = random.Random(0)
    n, length = (4, 200) if quick else (12, 600)
    prompts = [[rng.randrange(3, 500) for _ in range(length)] for _ in range(n)]
    max_tokens = 16 if quick else 64
    log(f"{arch}: {n} requests of {length} + {max_tokens} tokens, freeing on / off")
    on = run_engine(arch, prompts, max_tokens, keep_all=False)
    off = run_engine(arch, prompts, max_tokens, keep_all=True)
    assert on["outputs"] == off["outputs"], f"{arch}: freeing changed an output"
    return dict(
        arch=arch,
        requests=n,
        prompt_tokens=length,
        max_tokens=max_tokens,
        peak_kv_bytes_freed=on["peak_kv_bytes"],
        peak_kv_bytes_every_block_kept=off["peak_kv_bytes"],
        saving=1 - on["peak_kv_bytes"] / off["peak_kv_bytes"],
        outputs_identical=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, shorter engine requests")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    report = dict(
        benchmark="sliding_window_kv",
        block_size_tokens_public=BLOCK,
        derived=[derived(name) for name in PUBLIC],
        measured=[measured(arch, args.quick) for arch in ("mistral", "gemma2")],
    )
    for d in report["derived"]:
        last = d["per_sequence"][-1]
        log(f"{d['model']}: {last['tokens']} tokens saves {last['saving']:.1%} of KV")
    for m in report["measured"]:
        log(f"tiny {m['arch']}: peak KV {m['saving']:.1%} lower with freeing, same outputs")
    if args.json:
        write_json(args.json, report)
    else:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
