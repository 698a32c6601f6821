"""The planner on public model configs: exact parameter counts, KV bytes per token, fit on H100.

    python benchmarks/capacity_public_configs.py [--json PATH]

For every config in tests/data/model_configs (written from the public Hugging Face model pages,
see its README): parameters counted by transformers on the meta device (total, active per token,
FLOP parameters), KV bytes per token in bf16, and the plan on one H100-80GB at R6's workload
(600 in + 120 out tokens, max_model_len 4096): the budget, or the refusal the planner prints.
Machine-independent arithmetic; nothing is timed. (--quick is accepted and changes nothing.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO_ROOT, log, write_json
from capacity import memory
from capacity.fit import DoesNotFit
from capacity.params import count_params
from capacity.planner import PlanInputs, model_view, plan

CONFIGS = REPO_ROOT / "tests" / "data" / "model_configs"


def one(name: str) -> dict:
    raw = json.loads((CONFIGS / name / "config.json").read_text())
    count = count_params(raw)
    row = dict(
        model=name,
        params_total=count.total,
        params_active=count.active,
        params_flop=count.flop_params,
        tied_embeddings=count.tied_embeddings,
        kv_bytes_per_token_bf16=memory.kv_bytes_per_token(model_view(raw), "bf16"),
    )
    try:
        p = plan(PlanInputs(raw, "H100-80GB", 600, 120, 4096, 10.0, model_name=name))
        row["h100_plan"] = dict(
            weight_bytes=p.split.weight_bytes,
            kv_region_bytes=p.split.kv_region_bytes,
            max_concurrency_avg=p.max_concurrency_avg,
            max_concurrency_max_len=p.max_concurrency_max_len,
            warnings=list(p.warnings),
        )
    except DoesNotFit as err:
        row["h100_refused"] = str(err)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the same run (it takes seconds)")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    rows = []
    for folder in sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file()):
        rows.append(one(folder))
        log(f"{folder}: {rows[-1]['params_total']:,} parameters")
    report = dict(benchmark="capacity_public_configs", gpu="H100-80GB", models=rows)
    if args.json:
        write_json(args.json, report)
    else:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
