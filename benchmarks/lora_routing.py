"""Many LoRA fine-tunes over two replicas with a slot limit (the serving part of multi-adapter
serving): adapter slot loads with adapter-affinity routing against popularity-blind routing,
and time to first token against the base model alone at the same request rate.

    python benchmarks/lora_routing.py [--quick] [--json PATH] [--rate RPS] [--slots N]
        [--pure-only]

Pure part (deterministic, no timing): a seeded Zipf(1.0) stream over 50 adapters routed over
two replicas whose slots are the engine's SlotPool (LRU), by the production ranking
(`prefix_affinity_ranks(..., adapter=...)`) or by a uniformly random replica, for slot limits
4..25: how the loads ratio depends on the slot limit (benchmarks/_lora_routing.py).

Live part: a real Serve app on a local Ray cluster (2 CPUs, 127.0.0.1), two hot replicas of a
tiny random qwen2 (serving/tiny_models.py; one torch thread and num_cpus 0 each, as the
integration tests run them), 50 random rank-8 PEFT adapters declared in model.adapters, and
engine.max_loras = S. S is what the capacity planner sets engine.max_loras to for this
popularity (capacity.adapters.slots_per_replica, its default 5 % LRU miss target, two replicas,
max_num_seqs running each): 22 of a replica's 25 home adapters. An open-loop Poisson stream
(seeded, the same arrivals and prompts for every system) of streamed /v1/completions (8 tokens,
EOS ignored) names an adapter drawn by Zipf(1.0) popularity. Systems:
  affinity  the app as built: PrefixAffinityRouter (adapter affinity)
  blind     the same app, its replica deployments built with KVHeadroomRouter (by KV headroom
            only; the benchmark swaps the router class, no product config changes)
  base      the app without adapters (max_loras 0), every request on the base model
Each system first serves a warm-up stream (other arrivals, same popularity, 2.5x the rate)
that fills the slots, waits until idle, reads every replica's LoRA counters (ReplicaReading.lora:
admissions, loads, evictions; what tideserve_lora_* export), serves the measured stream, reads
them again.
TTFT is client-side: send to the first streamed text chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import _lora_routing as sim
from benchmarks._common import log, machine_info, start_local_ray, write_json
from benchmarks.loadgen import body_for, open_loop, summarize

PORT, APP = 18990, "lora_routing"
NUM_ADAPTERS, NUM_REPLICAS, ZIPF_EXPONENT = 50, 2, 1.0
MAX_NUM_SEQS, MAX_TOKENS, RANK = 16, 8, 8
LOADS_TARGET, TTFT_TARGET = 3.0, 1.5  # loads >= 3x fewer; TTFT p99 <= 1.5x the base model's
PURE_SLOTS = (4, 8, 12, 16, 20, 22, 24, 25)
# The warm-up only fills the slots (not measured): faster than the measured stream, so that a
# short run starts from the slots' steady state and not from their compulsory first loads.
WARMUP_RATE_FACTOR = 2.5
WORDS = ("river", "stone", "lamp", "cloud", "ember", "maple", "quartz", "harbor", "violet")


def planned_slots() -> int:
    """engine.max_loras as the capacity planner sizes it for this popularity (default target)."""
    from capacity.adapters import slots_per_replica

    weights = sim.zipf_weights(NUM_ADAPTERS, ZIPF_EXPONENT)
    return slots_per_replica(weights, NUM_REPLICAS, MAX_NUM_SEQS).slots


def pure_part(num_requests: int, warmup: int, seed: int) -> dict:
    stream = sim.zipf_stream(sim.adapter_names(NUM_ADAPTERS), num_requests, seed, ZIPF_EXPONENT)
    return sim.slot_sweep(stream, NUM_REPLICAS, PURE_SLOTS, warmup, seed)


def make_adapters(root: Path) -> tuple[Path, dict[str, str]]:
    """The tiny model's directory and NUM_ADAPTERS random rank-8 PEFT adapters of it."""
    from serving.tiny_adapters import save_random_lora
    from serving.tiny_models import save_tiny_model_dir, tiny_model

    model_dir = save_tiny_model_dir(root / "tiny", arch="qwen2", seed=7)
    paths = {
        name: str(save_random_lora(tiny_model("qwen2", seed=7), root / name, RANK, seed=k,
                                   b_std=0.1))
        for k, name in enumerate(sim.adapter_names(NUM_ADAPTERS))
    }  # fmt: skip
    return model_dir, paths


def app_args(model_dir: Path, adapters: dict[str, str], slots: int) -> dict:
    from tests.integration.serve_helpers import app_args as base_args

    engine = {"max_num_seqs": MAX_NUM_SEQS, "min_num_seqs": 4}
    model = {}
    if adapters:
        engine |= {"max_loras": slots, "max_lora_rank": RANK}
        model = {"adapters": adapters}
    return base_args(
        model_dir,
        engine=engine,
        model=model,
        pools={"hot": {"num_replicas": NUM_REPLICAS}, "cold": {"initial_replicas": 0}},
        controller={"enabled": False},
    )


def readings(app: str, timeout_s: float = 60.0) -> dict:
    """replica id -> ReplicaReading of every hot replica (Serve picks each call's replica, so
    ask until each one answered)."""
    from ray import serve

    handle = serve.get_deployment_handle("hot", app)
    seen: dict = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < NUM_REPLICAS and time.monotonic() < deadline:
        r = handle.reading.remote().result(timeout_s=30)
        seen[r.replica_id] = r
    if len(seen) < NUM_REPLICAS:
        raise RuntimeError(f"only {sorted(seen)} of {NUM_REPLICAS} hot replicas answered")
    return seen


def wait_idle(app: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        now = readings(app)
        busy = sum(r.num_running + r.num_waiting for r in now.values())
        if busy == 0 or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def requests_for(num: int, seed: int, base_model: str | None) -> list[tuple[str, dict]]:
    """(tier, body) of `num` requests: a distinct short prompt each, the model an adapter by
    Zipf popularity (or the base model)."""
    rng = random.Random(seed)
    names = sim.zipf_stream(sim.adapter_names(NUM_ADAPTERS), num, seed, ZIPF_EXPONENT)
    out = []
    for i, name in enumerate(names):
        prompt = f"Note {i}: " + " ".join(rng.choice(WORDS) for _ in range(12))
        body = body_for("interactive", prompt, MAX_TOKENS)
        out.append(("interactive", {**body, "model": base_model or name}))
    return out


def stream(url: str, rate_rps: float, duration_s: float, seed: int, base_model: str | None):
    """The open-loop stream: arrivals from `seed` (so identical for every system); bodies in
    order from a list (make_body draws nothing from the arrival generator)."""
    bodies = iter(requests_for(int(rate_rps * duration_s * 3) + 50, seed + 1, base_model))
    return asyncio.run(open_loop(url, rate_rps, duration_s, lambda _rng: next(bodies), seed))


def run_system(name: str, args, model_dir: Path, adapters: dict[str, str]) -> dict:
    from ray import serve

    import serving.app
    from tests.integration.serve_helpers import deploy

    cfg = app_args(model_dir, {} if name == "base" else adapters, args.slots)
    router = serving.app.ROUTER if name == "blind" else serving.app.PREFIX_ROUTER
    t0 = time.monotonic()
    with mock.patch.object(serving.app, "PREFIX_ROUTER", router):  # blind: headroom only
        deploy(cfg, name=APP)
    deploy_s = time.monotonic() - t0
    url = f"http://127.0.0.1:{PORT}/v1/completions"
    base_model = "tiny" if name == "base" else None
    warm_rps = WARMUP_RATE_FACTOR * args.rate
    log(f"{name}: deployed in {deploy_s:.0f} s; warm-up {args.warmup_s:.0f} s at {warm_rps} req/s")
    warm = stream(url, warm_rps, args.warmup_s, args.seed + 1000, base_model)
    before = wait_idle(APP)
    log(f"{name}: measured stream {args.duration_s:.0f} s at {args.rate} req/s")
    outcomes = stream(url, args.rate, args.duration_s, args.seed, base_model)
    after = wait_idle(APP)
    serve.delete(APP)
    per_replica = {
        rid: {
            "lora": vars_of(after[rid].lora.minus(before[rid].lora)),
            "prompt_tokens": after[rid].prefix_cache_query_tokens
            - before[rid].prefix_cache_query_tokens,
        }
        for rid in after
    }
    summary = summarize(outcomes, args.duration_s)["interactive"]
    return {
        "router": router.rsplit(":", 1)[1],
        "deploy_s": round(deploy_s, 1),
        "warmup_sent": len(warm),
        "warmup_ok": sum(1 for o in warm if o.status == 200 and o.error is None),
        # Little's law: requests in flight on average during the measured stream
        "mean_in_flight": sum(o.latency_s for o in outcomes) / args.duration_s,
        "per_replica": per_replica,
        "adapter_loads": sum(r["lora"]["loads"] for r in per_replica.values()),
        "adapter_requests": sum(r["lora"]["admissions"] for r in per_replica.values()),
        **summary,
    }


def vars_of(counts) -> dict:
    return {"admissions": counts.admissions, "loads": counts.loads, "evictions": counts.evictions}


def live_part(args) -> dict:
    from ray import serve

    systems = {}
    with tempfile.TemporaryDirectory() as tmp:
        log(f"writing the tiny model and {NUM_ADAPTERS} PEFT adapters")
        model_dir, adapters = make_adapters(Path(tmp))
        start_local_ray()
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        try:
            for name in ("affinity", "blind", "base"):
                systems[name] = run_system(name, args, model_dir, adapters)
        finally:
            serve.shutdown()
    aff, blind, base = systems["affinity"], systems["blind"], systems["base"]
    loads_ratio = blind["adapter_loads"] / aff["adapter_loads"] if aff["adapter_loads"] else None
    ttft_ratio = aff["ttft_p99_s"] / base["ttft_p99_s"] if base["ttft_p99_s"] else None
    return {
        "model": "tiny random qwen2 (serving/tiny_models.py, seed 7), float32",
        "adapters": {"count": NUM_ADAPTERS, "rank": RANK, "made_by": "serving.tiny_adapters"},
        "slots_per_replica": args.slots,
        "slots_rule": args.slots_rule,
        "workload": {
            "rate_rps": args.rate,
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "max_tokens": MAX_TOKENS,
            "popularity": f"Zipf({ZIPF_EXPONENT}) over {NUM_ADAPTERS}",
            "warmup_rate_rps": WARMUP_RATE_FACTOR * args.rate,
            "seed": args.seed,
            "replicas": NUM_REPLICAS,
            "torch_threads_per_replica": 1,
            "max_num_seqs": MAX_NUM_SEQS,
        },
        "systems": systems,
        "loads_ratio_blind_over_affinity": loads_ratio,
        "ttft_p99_ratio_affinity_over_base": ttft_ratio,
        "targets": {
            f"loads_ratio >= {LOADS_TARGET}": loads_ratio is not None
            and loads_ratio >= LOADS_TARGET,
            f"ttft_p99_ratio <= {TTFT_TARGET}": ttft_ratio is not None
            and ttft_ratio <= TTFT_TARGET,
        },
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter streams, fewer pure requests")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (4)")
    p.add_argument("--slots", type=int, default=None, help="engine.max_loras (the planner's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pure-only", action="store_true", help="skip the live part")
    args = p.parse_args()
    args.warmup_s = 10.0 if args.quick else 25.0
    args.duration_s = 25.0 if args.quick else 80.0
    args.slots_rule = "given with --slots"
    if args.slots is None:
        args.slots = planned_slots()
        args.slots_rule = (
            "capacity.adapters.slots_per_replica(Zipf(1.0) over 50, 2 replicas, "
            f"{MAX_NUM_SEQS} running each, max_miss_fraction 0.05)"
        )
    return args


def main() -> None:
    args = parse_args()
    t0 = time.monotonic()
    n = 5000 if args.quick else 20000
    result = {
        "benchmark": "lora_routing",
        "quick": args.quick,
        "machine": machine_info("cpu", "float32"),
        "pure": pure_part(n, n // 10, args.seed),
    }
    if not args.pure_only:
        result["live"] = live_part(args)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    if args.json:
        write_json(args.json, result)
    print(json.dumps({k: v for k, v in result.items() if k != "pure"}, indent=2))
    for row in result["pure"]["by_slots"]:
        print(
            f"slots {row['slots']:>2}: loads/request affinity "
            f"{row['affinity_loads_per_request']:.3f} blind {row['blind_loads_per_request']:.3f}"
            f", ratio (min of 3 id sets) {row['loads_ratio_min']}"
        )


if __name__ == "__main__":
    main()
