"""`python -m capacity adapters` / `tideserve adapters`: the LoRA slots a replica needs, from the
command line; the numbers are slots_per_replica's (test_adapters.py holds those)."""

from __future__ import annotations

import json

import pytest

from capacity.adapters import slots_per_replica
from capacity.cli import main
from serving.tiny_models import tiny_config

ZIPF_50 = [1.0 / (k + 1) for k in range(50)]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["adapters", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_zipf_adapters_print_the_planner_slots_as_json(capsys):
    code, out, _ = run(
        capsys, "--num-adapters", "50", "--replicas", "2", "--running-per-replica", "16", "--json"
    )
    assert code == 0
    got = json.loads(out)
    want = slots_per_replica(ZIPF_50, 2, 16)
    assert got["slots"] == want.slots == 22
    assert got["miss_fraction"] == pytest.approx(want.miss_fraction)
    assert got["num_adapters"] == 50 and got["slot_bytes"] is None


def test_a_popularity_file_and_a_model_give_the_slot_bytes(capsys, tmp_path):
    (tmp_path / "pop.json").write_text(json.dumps([5, 3, 1, 1]))
    model = tmp_path / "config.json"
    model.write_text(tiny_config().to_json_string())
    code, out, _ = run(
        capsys, "--popularity", str(tmp_path / "pop.json"), "--replicas", "1",
        "--running-per-replica", "2", "--model", str(model), "--dtype", "float32",
    )  # fmt: skip
    assert code == 0
    assert "engine.max_loras:" in out and "GiB per replica" in out


FLEET = ["--replicas", "2", "--running-per-replica", "4"]


@pytest.mark.parametrize(
    "argv, says",
    [
        (FLEET, "either --num-adapters"),
        (["--num-adapters", "0", *FLEET], "--num-adapters=0"),
        (["--num-adapters", "5", "--zipf", "-1", *FLEET], "--zipf=-1"),
        (["--num-adapters", "5", "--replicas", "0", "--running-per-replica", "4"], "num_replicas"),
    ],
)
def test_bad_arguments_exit_2_naming_the_field(capsys, argv, says):
    code, _, err = run(capsys, *argv)
    assert code == 2 and says in err, err


def test_tideserve_lists_the_command():
    from tideserve.cli import COMMANDS

    assert "adapters" in COMMANDS
