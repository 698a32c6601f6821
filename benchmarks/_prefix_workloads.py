"""The prefix-cache benchmark's workloads and its tideserve side (benchmarks/prefix_cache.py):
multi-turn chats and a shared long instruction as token ids, run through an LLMEngine in this
process, and the routing simulation of two replicas over the chat's requests."""

from __future__ import annotations

import random
import time

from common.stats import percentile

SEED = 34


# ----- workloads ----------------------------------------------------------------------------------
def chat_workload(convs: int, turns: int, system_tokens: int, user_tokens: int, vocab: int):
    rng = random.Random(SEED)
    system = [rng.randrange(100, vocab) for _ in range(system_tokens)]
    users = [
        [
            [rng.randrange(100, vocab) for _ in range(rng.randint(user_tokens // 2, user_tokens))]
            for _ in range(turns)
        ]
        for _ in range(convs)
    ]
    return system, users


def instruction_workload(n: int, inst_tokens: int, vocab: int):
    rng = random.Random(SEED + 1)
    inst = [rng.randrange(100, vocab) for _ in range(inst_tokens)]
    return [inst + [rng.randrange(100, vocab) for _ in range(rng.randint(8, 24))] for _ in range(n)]


# ----- tideserve, in process ----------------------------------------------------------------------
def make_engine(model_dir: str, caching: bool, num_kv_blocks: int):
    from serving.engine import EngineConfig, LLMEngine

    cfg = EngineConfig(
        prefix_caching=caching, num_kv_blocks=num_kv_blocks, max_num_seqs=64, min_num_seqs=64
    )
    return LLMEngine.from_pretrained(model_dir, cfg)


def record_uncached_tokens(engine) -> dict[str, int]:
    """request id -> prompt tokens it still computed after its prefix-cache match, recorded by
    a schedule hook in the step that admits it (before that step's forward)."""
    uncached: dict[str, int] = {}

    def hook(batch) -> None:
        for seq in batch.admitted:
            uncached.setdefault(seq.request_id, seq.num_uncomputed_tokens)

    engine.schedule_hooks.append(hook)
    return uncached


def run_chat_engine(engine, system, users, max_tokens: int) -> dict:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    history = [list(system) for _ in users]
    turn = [0] * len(users)
    owner: dict[str, int] = {}
    replies: list[list[list[int]]] = [[] for _ in users]
    ttft: list[tuple[int, float]] = []
    # (prompt, reply) in submission order, for the routing simulation
    order: list[tuple[list[int], list[int]]] = []
    entry: dict[str, tuple[list[int], list[int]]] = {}
    uncached = record_uncached_tokens(engine)
    tails: list[int] = []  # uncached prompt tokens of each turn >= 2

    def submit(c: int) -> None:
        history[c] += users[c][turn[c]]
        order.append((list(history[c]), []))
        rid = engine.add_request(list(history[c]), params)
        owner[rid], entry[rid] = c, order[-1]

    t0 = time.perf_counter()
    for c in range(len(users)):
        submit(c)
    out_tokens = 0
    while engine.has_unfinished():
        for seq in engine.step():
            if not seq.finished:
                continue
            c = owner.pop(seq.request_id)
            entry.pop(seq.request_id)[1].extend(seq.output_token_ids)
            ttft.append((turn[c], seq.first_token_s - seq.arrival_s))
            if turn[c] >= 1:
                tails.append(uncached[seq.request_id])
            replies[c].append(seq.output_token_ids)
            history[c] += seq.output_token_ids
            out_tokens += seq.num_output_tokens
            turn[c] += 1
            if turn[c] < len(users[c]):
                submit(c)
    wall = time.perf_counter() - t0
    later = [t for k, t in ttft if k >= 1]
    stats = engine.stats()
    return {
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(out_tokens / wall, 2),
        "ttft_p50_turns2plus_s": round(percentile(later, 50), 4),
        "ttft_p99_turns2plus_s": round(percentile(later, 99), 4),
        "ttft_p50_turn1_s": round(percentile([t for k, t in ttft if k == 0], 50), 4),
        "prefix_hit_fraction": round(stats.prefix_cache_hit_fraction, 4),
        # prompt tokens a turn >= 2 still computed after its prefix-cache match (its tail)
        "uncached_prompt_tokens_p50_turns2plus": percentile(tails, 50),
        "uncached_prompt_tokens_mean_turns2plus": round(sum(tails) / max(1, len(tails)), 2),
        # turns that continued in the partial block their previous reply ended in
        "num_partial_block_takeovers": engine.pool.num_partial_takeovers,
        "num_preemptions": stats.num_preemptions,
        "_replies": replies,
        "_order": order,
    }


def run_instruction_engine(engine, prompts, max_tokens: int) -> dict:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    rids = [engine.add_request(p, params) for p in prompts]
    done: dict[str, object] = {}
    while engine.has_unfinished():
        for seq in engine.step():
            if seq.finished:
                done[seq.request_id] = seq
    wall = time.perf_counter() - t0
    seqs = [done[r] for r in rids]
    ttfts = [s.first_token_s - s.arrival_s for s in seqs]
    return {
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(sum(s.num_output_tokens for s in seqs) / wall, 2),
        "ttft_p50_s": round(percentile(ttfts, 50), 4),
        "ttft_p99_s": round(percentile(ttfts, 99), 4),
        "prefix_hit_fraction": round(engine.stats().prefix_cache_hit_fraction, 4),
        "_outputs": [s.output_token_ids for s in seqs],
    }


# ----- routing simulation -------------------------------------------------------------------------
def simulate_routing(order, num_blocks: int, block: int, system_tokens: int) -> dict:
    """Hit rates of the chat's (prompt, reply) pairs in submission order, each request's blocks
    (prompt and reply) cached when it ends, on 1 replica, 2 by prefix affinity (the default
    key length, and one that reaches past the shared system prompt), 2 round-robin; with the
    largest share of requests one replica got."""
    from serving.engine.kv_blocks import BlockPool, Refused
    from serving.engine.prefix_cache import extend_block_hashes, root_hash
    from serving.llm.prefix_affinity import AffinityBound
    from serving.llm.router import prefix_affinity_ranks

    root = root_hash("sim", "float32")

    def run(num_replicas: int, prefix_tokens: int | None) -> dict:
        bound = AffinityBound(prefix_tokens=prefix_tokens or 1)
        pools = [BlockPool(num_blocks, block) for _ in range(num_replicas)]
        for p in pools:
            p.enable_caching()
        queried = hit = 0
        counts = [0] * num_replicas
        for i, (prompt, reply) in enumerate(order):
            if prefix_tokens is None:  # round-robin
                k = i % num_replicas
            else:
                replicas = [(k, f"replica-{k}", None) for k in range(num_replicas)]
                k = prefix_affinity_ranks(prompt, replicas, bound)[0][0]
            counts[k] += 1
            pool, full, sid = pools[k], prompt + reply, f"r{i}"
            hs = extend_block_hashes([], full, block, root)
            cached = pool.match(hs, (len(prompt) - 1) // block)
            queried += len(prompt)
            hit += len(cached) * block
            pool.share(sid, cached)
            if not isinstance(pool.grow(sid, len(full)), Refused):
                pool.commit(sid, hs, len(full))
            pool.free(sid)
        return {"hit_fraction": round(hit / queried, 4), "max_share": max(counts) / len(order)}

    default = AffinityBound().prefix_tokens
    one = run(1, default)
    two = run(2, default)
    past = run(2, system_tokens + 16)
    rr = run(2, None)
    return {
        "method": "simulation: the chat's prompts in the engine's submission order, routed by "
        "PrefixAffinityRouter's pure choice (serving/llm/router.py; replicas report no load, "
        "so the bound never spills) onto BlockPools of the engine's size with prefix caching; "
        "each request's blocks (prompt and reply) are cached when it ends. max_share: the "
        "largest share of requests one replica got (0.5 = even)",
        "one_replica": one,
        f"two_replicas_affinity_prefix_{default}_tokens": two,
        f"two_replicas_affinity_prefix_{system_tokens + 16}_tokens": past,
        "two_replicas_round_robin": rr,
        "affinity_over_one_default_key": round(two["hit_fraction"] / one["hit_fraction"], 4),
        "affinity_over_one_key_past_system_prompt": round(
            past["hit_fraction"] / one["hit_fraction"], 4
        ),
    }
