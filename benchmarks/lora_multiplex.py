"""Many LoRA fine-tunes in one engine (the engine part of multi-adapter serving): decode
throughput of a batch that mixes adapters against the base model alone at the same batch
size, on the embedded SmolLM2-135M-Instruct, and the two ways of computing the batched
low-rank update.

    python benchmarks/lora_multiplex.py [--quick] [--json PATH] [--batch 16] [--max-tokens 64]
        [--num-adapters 16] [--rounds R] [--threads N]

Adapters: random rank-8 and rank-16 LoRAs (alternating) on all seven projections, made by PEFT
(`get_peft_model` + `save_pretrained`) in a temporary directory, B drawn with std 0.01.
Systems, each an LLMEngine at `dtype: auto`, decoding --batch requests of --max-tokens tokens
(EOS ignored) from the same prompts:
  base           the engine without adapter slots (max_loras 0): the base model alone
  base_in_lora   the adapter engine (slots for every adapter), all requests on the base model
  zipf           the adapter engine, each request's adapter drawn from a Zipf(1.0) popularity
                 over the adapters, as the issue's trace (top adapter ~31 %)
  distinct       the adapter engine, every request on a different adapter (the worst case)
Decode throughput counts only pure-decode steps (no prefill) from the engine's step log; each
system runs --rounds times alternating and the best round counts (a shared machine).
Threads: by default what a replica holding this node runs (`torch_threads: auto`, one model
thread on 2 cores); --threads 2 measures both cores on the model, where the small LoRA kernels
gain nothing from the second thread but pay its synchronisation, so the ratio is lower.
The kernel section times one decode step's LoRA updates over SmolLM2's projections (30 layers x
7, each layer its own slot stacks) at --batch rows: the two embedding-bag sums that read each
row's slot in place (what layer.py does for decode rows) against gathering each row's A/B then
bmm, and against grouping rows by adapter, either indexing each adapter's rows out and back,
or multiplying all rows and masking each adapter's own (one pair of matmuls per adapter present,
layer.py's way before).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import _common as c
from capacity.adapters import zipf_popularity
from serving.engine import torch_thread
from serving.engine.lora.layer import LoraState
from serving.tiny_adapters import ALL_PROJECTIONS

TARGET = 0.8  # mixed-adapter decode throughput >= 0.8x the base model's at the same batch
ENGINE = dict(max_num_seqs=64, min_num_seqs=16, max_num_batched_tokens=512, block_size_tokens=16)
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 32 tokens, 8 adapters")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--num-adapters", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: what a replica holding this node runs, torch_threads auto)",
    )
    args = p.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.max_tokens = args.max_tokens or (32 if args.quick else 64)
    args.num_adapters = args.num_adapters or (8 if args.quick else 16)
    args.threads = args.threads or serving_threads()
    return args


def serving_threads() -> int:
    """The model threads a replica holding this node runs (`torch_threads: auto`): all cores
    but the one left to the front door and Ray, so the ratio is the one a replica sees."""
    cores = torch_thread.node_cores()
    return torch_thread.core_layout(torch_thread.AUTO, len(cores), cores).threads


def zipf_choices(names: list[str], n: int, seed: int = 0) -> list[str]:
    import random

    weights = zipf_popularity(len(names))
    return random.Random(seed).choices(names, weights=weights, k=n)


def make_adapters(model_dir: Path, root: Path, num: int) -> dict[str, str]:
    """PEFT adapters of alternating rank 8 / 16 on one PEFT model, saved one directory each."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = None
    paths: dict[str, str] = {}
    for k in range(num):
        rank = 8 if k % 2 == 0 else 16
        cfg = LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=list(ALL_PROJECTIONS),
            init_lora_weights=False,
        )
        name = f"ft{k:02d}"
        torch.manual_seed(k)
        if peft_model is None:
            peft_model = get_peft_model(base, cfg, adapter_name=name)
        else:
            peft_model.add_adapter(name, cfg)
        with torch.no_grad():
            for pname, param in peft_model.named_parameters():
                if f"lora_B.{name}." in pname:
                    param.normal_(0.0, 0.01)
        out = root / name
        peft_model.save_pretrained(out, selected_adapters=[name])
        saved = out / name if (out / name / "adapter_config.json").exists() else out
        paths[name] = str(saved)
    return paths


def decode_tps(engine, prompts: list[list[int]], adapters: list[str | None], max_tokens: int):
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.step_log.clear()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [params] * len(prompts), adapters=adapters)
    wall = time.perf_counter() - t0
    decode = [s for s in engine.step_log if s.num_tokens == s.num_seqs == len(prompts)]
    tokens = sum(s.num_seqs for s in decode)
    seconds = sum(s.step_s for s in decode)
    assert all(len(o.token_ids) == max_tokens for o in outs)
    return {"decode_tok_s": tokens / seconds, "num_decode_steps": len(decode), "wall_s": wall}


def kernel_times(batch: int, model_config, ranks=(8, 16), reps: int = 5) -> dict:
    """Milliseconds of one decode step's LoRA updates (all layers, all projections, each layer
    its own slot stacks so no layer's weights sit in cache for the next) per method, for 1, 4
    and --batch adapters among the --batch rows."""
    from capacity.memory import KVShape

    shape = KVShape.from_config(model_config)
    h, i = model_config.hidden_size, model_config.intermediate_size
    q, kv = model_config.num_attention_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    projs = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    r = max(ranks)
    slots = 16
    layers = [
        [(torch.randn(slots, a, r), torch.randn(slots, r, b)) for a, b in projs]
        for _ in range(model_config.num_hidden_layers)
    ]
    xs = [torch.randn(batch, a) for a, _ in projs]
    out: dict[str, dict[str, float]] = {}
    for distinct in (1, 4, batch):
        row_slots = torch.tensor([k % distinct for k in range(batch)])
        groups = [(s, (row_slots == s).nonzero().squeeze(1)) for s in row_slots.unique().tolist()]
        masks = [(s, (row_slots == s).unsqueeze(1)) for s, _ in groups]
        state = LoraState()
        for a, _ in projs:
            state.register(a, r, torch.device("cpu"))
        shrink, expand = state.bag_indices(row_slots.unsqueeze(1))  # as plan_step builds them

        def gather(row_slots=row_slots):
            for weights in layers:
                for (a, b), x in zip(weights, xs, strict=True):
                    hdn = torch.bmm(x.unsqueeze(1), a.index_select(0, row_slots))
                    torch.bmm(hdn, b.index_select(0, row_slots))

        def grouped(groups=groups):
            for weights in layers:
                for (a, b), x in zip(weights, xs, strict=True):
                    y = torch.zeros(batch, b.shape[2])
                    for s, idx in groups:
                        y.index_add_(0, idx, (x.index_select(0, idx) @ a[s]) @ b[s])

        def masked(masks=masks):  # layer.py's way before the embedding bags
            for weights in layers:
                for (a, b), x in zip(weights, xs, strict=True):
                    y = torch.zeros(batch, b.shape[2])
                    for s, mask in masks:
                        y.addmm_((x @ a[s]).mul_(mask), b[s])

        def bags(shrink=shrink, expand=expand):  # serving/engine/lora/layer.py's way
            for weights in layers:
                for (a, b), x in zip(weights, xs, strict=True):
                    index, offsets = shrink[a.shape[1]]
                    flat_x = x.view(-1)
                    a_flat = a.view(-1, r)
                    hdn = torch.embedding_bag(a_flat, index, offsets, False, 0, False, flat_x)
                    index, offsets = expand
                    b_flat = b.view(-1, b.shape[2])
                    torch.embedding_bag(b_flat, index, offsets, False, 0, False, hdn[0].view(-1))

        res = {}
        methods = (
            ("gather_bmm", gather),
            ("index_by_adapter", grouped),
            ("mask_by_adapter", masked),
            ("embedding_bag", bags),
        )
        for name, fn in methods:
            best = float("inf")
            with torch.inference_mode():
                fn()
                for _ in range(reps):
                    t0 = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t0)
            res[name] = best * 1e3
        out[f"{distinct}_adapters"] = res
    return {
        "unit": "milliseconds per decode step (all layers), best of reps",
        "rank": r,
        "by_mix": out,
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from serving.engine import EngineConfig, LLMEngine
    from serving.model_source import resolve_model_dir

    model_dir = resolve_model_dir("embedded")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True
    )
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    prompts = [prompt + [tokenizer.encode(" ")[0]] * k for k in range(args.batch)]  # distinct
    with tempfile.TemporaryDirectory() as tmp:
        c.log(f"making {args.num_adapters} adapters with PEFT")
        paths = torch_thread.call(make_adapters, model_dir, Path(tmp), args.num_adapters)
        base = LLMEngine.from_pretrained(model_dir, EngineConfig(**ENGINE))
        lora = LLMEngine.from_pretrained(
            model_dir, EngineConfig(max_loras=args.num_adapters, max_lora_rank=16, **ENGINE)
        )
        for name, path in paths.items():
            lora.add_adapter(name, path)
    names = list(paths)
    mixes = {
        "base": (base, [None] * args.batch),
        "base_in_lora": (lora, [None] * args.batch),
        "zipf": (lora, zipf_choices(names, args.batch)),
        "distinct": (lora, [names[k % len(names)] for k in range(args.batch)]),
    }
    for engine, adapters in mixes.values():  # warm-up (and every adapter into its slot)
        decode_tps(engine, prompts, adapters, 4)
    runs: dict[str, list[dict]] = {k: [] for k in mixes}
    for r in range(args.rounds):
        for name, (engine, adapters) in mixes.items():
            runs[name].append(decode_tps(engine, prompts, adapters, args.max_tokens))
            c.log(f"round {r}: {name} {runs[name][-1]['decode_tok_s']:.1f} decode tok/s")
    best = {k: max(v, key=lambda x: x["decode_tok_s"]) for k, v in runs.items()}
    tps = {k: v["decode_tok_s"] for k, v in best.items()}
    ratios = {f"{k}_vs_base": tps[k] / tps["base"] for k in ("base_in_lora", "zipf", "distinct")}
    kernels = torch_thread.call(kernel_times, args.batch, base.model.config)
    report = {
        "benchmark": "lora_multiplex (engine part)",
        "machine": c.machine_info("cpu", str(base.dtype).removeprefix("torch.")),
        "model": "SmolLM2-135M-Instruct (embedded), float32 on this CPU (dtype auto)",
        "adapters": {
            "count": args.num_adapters,
            "ranks": "8 and 16 alternating",
            "targets": "q,k,v,o,gate,up,down",
            "made_by": "peft get_peft_model + save_pretrained, random A, B ~ N(0, 0.01)",
            "slot_bytes": lora.adapters.slot_bytes,
        },
        "workload": {
            "batch": args.batch,
            "max_tokens": args.max_tokens,
            "prompt_tokens": len(prompt),
            "rounds": args.rounds,
            "zipf_mix": mixes["zipf"][1],
            "distinct_adapters_in_zipf_mix": len(set(mixes["zipf"][1])),
            "engine_config": ENGINE,
            "torch_threads": args.threads,
            "serving_layout_threads": serving_threads(),
        },
        "decode_tokens_per_s": tps,
        "runs": runs,
        "ratios": ratios,
        "target": TARGET,
        "target_met_zipf": ratios["zipf_vs_base"] >= TARGET,
        "target_met_distinct": ratios["distinct_vs_base"] >= TARGET,
        "kernels": kernels,
    }
    print({k: report[k] for k in ("decode_tokens_per_s", "ratios")})
    print(kernels)
    if args.json:
        c.write_json(args.json, report)


if __name__ == "__main__":
    main()
