"""The concurrency tuner (R7 for continuous batching) when the length mix shifts half-way.

    python benchmarks/concurrency_tuner.py [--quick] [--json PATH]

In-process and engine-level (no Ray, no HTTP): one LLMEngine serving the embedded SmolLM2-135M
on the CPU, driven by an open-loop Poisson arrival process; TTFT counts from each request's
scheduled arrival, so a loop that falls behind is charged for it. First half: short chats; second
half: long summaries. Runs, all on the same request stream (fixed seed):

* sweep: each half alone at every fixed (max_num_seqs, max_num_batched_tokens) of a grid; the best
  fixed setting of a half is the one with the most tokens/s among those meeting the SLO;
* fixed: the whole shifted stream at the starting setting (what runs without the tuner);
* tuner: the whole shifted stream from the same starting setting, the tuner in the loop
  (serving/engine/tuning.py, one decision per --interval-s).

Per half: TTFT p99, inter-token p99 (both against the SLO), and tokens/s = output tokens of the
half's requests / (last of them finished - half start).

Time is a dedicated core's: the engine's clock is this thread's CPU time (torch computes on it
with one intra-op thread) plus the idle gaps skipped to the next arrival, so other jobs on a
shared machine stretch the wall time of a run, not its measurements. Everything still comes from
this machine's real forwards; compare the rows of one run, not numbers across machines.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import log, machine_info, write_json
from common.stats import percentile


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt: tuple[int, ...]
    max_tokens: int
    half: int  # 0: chats, 1: summaries


@dataclass(frozen=True)
class Mix:
    rate_per_s: float
    prompt_tokens: tuple[int, int]  # uniform range
    output_tokens: tuple[int, int]


def arrivals(mix: Mix, start_s: float, span_s: float, half: int, rng, vocab: int) -> list[Arrival]:
    out, t = [], start_s + rng.expovariate(mix.rate_per_s)
    while t < start_s + span_s:
        n = rng.randint(*mix.prompt_tokens)
        prompt = tuple(rng.randrange(10, vocab) for _ in range(n))
        out.append(Arrival(t, prompt, rng.randint(*mix.output_tokens), half))
        t += rng.expovariate(mix.rate_per_s)
    return out


class TokenClock:
    """Engine observer: the time of every token of every request."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)

    def on_step(self, engine, now, step_s, batch, touched) -> None:
        for seq in touched:
            if seq.first_token_s is not None and not seq.error and seq.num_output_tokens:
                self.times[seq.request_id].append(now)


class VirtualClock:
    """Seconds of a dedicated core: this thread's CPU time while it works (torch runs on this
    thread with one intra-op thread), plus the idle gaps it skips to the next arrival. Other jobs
    on a shared machine then slow the run down without changing what it measures."""

    def __init__(self) -> None:
        self._cpu0, self.skipped_s = time.thread_time(), 0.0

    def __call__(self) -> float:
        return time.thread_time() - self._cpu0 + self.skipped_s

    def skip_to(self, t: float) -> None:
        self.skipped_s += max(0.0, t - self())


class OnClock:
    """Hands an observer each step's duration on the virtual clock instead of the wall's."""

    def __init__(self, inner, clock: VirtualClock) -> None:
        self.inner, self.clock, self.start = inner, clock, clock()

    def on_step(self, engine, now, step_s, batch, touched) -> None:
        self.inner.on_step(engine, now, now - self.start, batch, touched)


def run(model, tok, stream: list[Arrival], limits, args, tuned: bool, cap_s: float) -> dict:
    """Serve `stream` open-loop on the virtual clock; per-half results and the tuner's moves."""
    from serving.engine import EngineConfig, LLMEngine, SamplingParams
    from serving.engine.tuning import EngineTuner, TierSlo

    seqs_, tokens_ = limits
    cfg = EngineConfig(
        kv_cache_bytes=args.kv_mib * 2**20,
        max_num_seqs=seqs_,
        min_num_seqs=min(seqs_, 4),
        max_num_batched_tokens=tokens_,
        max_model_len=2048,
    )
    clock = VirtualClock()
    engine = LLMEngine(model, tok, cfg, clock=clock)
    tokens = TokenClock()
    engine.observers.append(tokens)
    t0 = clock()
    tuner, timed = None, None
    if tuned:
        slo = {"interactive": TierSlo(args.ttft_slo, args.itl_slo)}
        tuner = EngineTuner(engine, slo, t0, interval_s=args.interval_s)
        timed = OnClock(tuner.window, clock)
        engine.observers[engine.observers.index(tuner.window)] = timed
    seqs, i, wall0 = [], 0, time.monotonic()
    while (i < len(stream) or engine.has_unfinished()) and clock() - t0 < cap_s:
        if time.monotonic() - wall0 > 20 * cap_s:
            raise RuntimeError(f"run {limits} took over {20 * cap_s:.0f} s of wall time")
        while i < len(stream) and stream[i].at_s <= clock() - t0:
            a = stream[i]
            params = SamplingParams(max_tokens=a.max_tokens, temperature=0, ignore_eos=True)
            seq = engine.make_sequence(list(a.prompt), params, "interactive", None, None)
            seq.arrival_s = t0 + a.at_s  # the scheduled arrival: lateness of this loop counts
            engine.submit(seq)
            seqs.append((a, seq))
            i += 1
        if engine.has_unfinished():
            if timed is not None:
                timed.start = clock()
            engine.step()
        elif i < len(stream):
            clock.skip_to(t0 + stream[i].at_s)
        if tuner is not None:
            tuner.maybe_tune(clock())
    end = clock()
    halves = [_half(h, seqs, tokens, t0, end, args) for h in sorted({a.half for a in stream})]
    moves = (
        [] if tuner is None else [(round(t - t0, 1), m.action, m.reason) for t, m in tuner.moves]
    )
    return {"limits": list(limits), "halves": halves, "moves": moves, "served_s": end - t0}


def _half(half: int, seqs, clock: TokenClock, t0: float, end: float, args) -> dict:
    mine = [(a, s) for a, s in seqs if a.half == half]
    start = min(a.at_s for a, _ in mine)
    ttfts, gaps, tokens, last = [], [], 0, start
    for _, s in mine:
        times = clock.times.get(s.request_id, [])
        ttfts.append(times[0] - s.arrival_s if times else float("inf"))
        gaps += [b - x for x, b in itertools.pairwise(times)]
        tokens += len(times)
        last = max(last, (times[-1] - t0) if s.finished and times else end - t0)
    ttft_p99, itl_p99 = percentile(ttfts, 99), percentile(gaps, 99)
    return {
        "half": HALVES[half],
        "requests": len(mine),
        "finished": sum(1 for _, s in mine if s.finished),
        "ttft_p99_s": None if ttft_p99 == float("inf") else round(ttft_p99, 4),  # None: no token
        "itl_p99_s": round(itl_p99, 4),
        "tokens_per_s": round(tokens / max(last - start, 1e-9), 2),
        "meets_slo": ttft_p99 <= args.ttft_slo and itl_p99 <= args.itl_slo,
    }


HALVES = ("chats", "summaries")


def load_model(args):
    import torch

    from serving.engine import loader
    from serving.model_source import resolve_model_dir

    torch.set_num_threads(args.threads)
    path = resolve_model_dir("embedded")
    dtype = getattr(torch, args.dtype)
    model = loader.load_model(str(path), dtype, torch.device("cpu"))
    return model, loader.load_tokenizer(str(path), None), str(path)


def streams(args, vocab: int) -> tuple[list[Arrival], list[list[Arrival]]]:
    """The shifted stream, and each half alone (the same requests, each half from t=0)."""
    rng = random.Random(args.seed)
    chats = Mix(args.chat_rate, (24, 72), (16, 48))
    summaries = Mix(args.summary_rate, (256, 512), (32, 64))
    first = arrivals(chats, 0.0, args.half_s, 0, rng, vocab)
    second = arrivals(summaries, args.half_s, args.half_s, 1, rng, vocab)
    alone = [first, [Arrival(a.at_s - args.half_s, *_rest(a)) for a in second]]
    return first + second, alone


def _rest(a: Arrival):
    return a.prompt, a.max_tokens, a.half


def sweep(model, tok, alone, args) -> list[dict]:
    rows = []
    for half, stream in enumerate(alone):
        for limits in itertools.product(args.grid_seqs, args.grid_tokens):
            if limits[1] < limits[0]:
                continue  # the budget must hold a decode token per running sequence
            res = run(model, tok, stream, limits, args, False, cap_s=2 * args.half_s)
            h = res["halves"][0]
            rows.append({"limits": list(limits), **h})
            log(f"sweep {HALVES[half]} {limits}: {_fmt(h)}")
    return rows


def _fmt(h: dict) -> str:
    ttft = "none" if h["ttft_p99_s"] is None else f"{h['ttft_p99_s']:.2f}"
    ok = "ok" if h["meets_slo"] else "SLO broken"
    return f"TTFT p99 {ttft} s, ITL p99 {h['itl_p99_s']:.3f} s, {h['tokens_per_s']:.1f} tok/s, {ok}"


def best_fixed(rows: list[dict]) -> dict[str, dict | None]:
    out = {}
    for name in HALVES:
        good = [r for r in rows if r["half"] == name and r["meets_slo"]]
        out[name] = max(good, key=lambda r: r["tokens_per_s"]) if good else None
    return out


def judge(best: dict, tuned: dict, fixed: dict) -> dict:
    """The claims: the tuner meets the SLO in both halves within 10% of the best fixed setting's
    tokens/s; the fixed start breaks the SLO or loses > 20% in at least one half."""
    out = {}
    for run_name, res, need in (("tuner", tuned, 0.9), ("fixed_start", fixed, 0.8)):
        per_half = {}
        for h in res["halves"]:
            ref = best[h["half"]]
            share = None if ref is None else h["tokens_per_s"] / ref["tokens_per_s"]
            per_half[h["half"]] = {
                "meets_slo": h["meets_slo"],
                "tokens_per_s_vs_best_fixed": None if share is None else round(share, 3),
                "within": share is not None and share >= need,
            }
        out[run_name] = per_half
    out["tuner_claim_met"] = all(v["meets_slo"] and v["within"] for v in out["tuner"].values())
    out["fixed_start_falls_short"] = any(
        not v["meets_slo"] or not v["within"] for v in out["fixed_start"].values()
    )
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="short halves, a 2x2 sweep grid")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--half-s", type=float, default=None, help="seconds per half (40; quick 20)")
    p.add_argument("--chat-rate", type=float, default=3.0, help="chat arrivals per second")
    p.add_argument("--summary-rate", type=float, default=0.4, help="summary arrivals per s")
    p.add_argument("--ttft-slo", type=float, default=3.0, help="TTFT p99 SLO, seconds")
    p.add_argument("--itl-slo", type=float, default=0.25, help="inter-token p99 SLO, seconds")
    p.add_argument("--start", type=int, nargs=2, default=(32, 512), help="seqs, tokens")
    p.add_argument("--grid-seqs", type=int, nargs="+", default=None)
    p.add_argument("--grid-tokens", type=int, nargs="+", default=None)
    p.add_argument("--interval-s", type=float, default=2.0, help="tuner decision interval")
    p.add_argument("--kv-mib", type=int, default=256, help="KV cache per engine, MiB")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-sweep", action="store_true", help="only the fixed and tuner runs")
    args = p.parse_args(argv)
    args.half_s = args.half_s or (20.0 if args.quick else 40.0)
    args.grid_seqs = args.grid_seqs or ([32, 64] if args.quick else [16, 32, 64])
    args.grid_tokens = args.grid_tokens or ([128, 512] if args.quick else [64, 128, 256, 512])
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    model, tok, _ = load_model(args)
    stream, alone = streams(args, model.config.vocab_size)
    log(f"stream: {len(alone[0])} chats then {len(alone[1])} summaries, {args.half_s:.0f} s each")
    rows = [] if args.skip_sweep else sweep(model, tok, alone, args)
    best = best_fixed(rows)
    cap = 3 * args.half_s
    fixed = run(model, tok, stream, tuple(args.start), args, False, cap)
    log("fixed start: " + "; ".join(f"{h['half']}: {_fmt(h)}" for h in fixed["halves"]))
    tuned = run(model, tok, stream, tuple(args.start), args, True, cap)
    log("tuner: " + "; ".join(f"{h['half']}: {_fmt(h)}" for h in tuned["halves"]))
    report = {
        "benchmark": "concurrency_tuner",
        "machine": machine_info("cpu", args.dtype),
        "model": "SmolLM2-135M-Instruct (embedded), " + args.dtype,
        "how": "in-process engine, no Ray; open-loop Poisson arrivals; TTFT from scheduled arrival",
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "slo": {"ttft_p99_s": args.ttft_slo, "itl_p99_s": args.itl_slo},
        "sweep": rows,
        "best_fixed": best,
        "fixed_start": fixed,
        "tuner": tuned,
        "claims": judge(best, tuned, fixed) if rows else None,
    }
    print(json.dumps(report["claims"], indent=2))
    if args.json:
        write_json(args.json, report)
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
