"""The batch store and input parsing: atomic records, a journal whose torn tail is cut, and
OpenAI's line-level validation errors."""

from __future__ import annotations

import json

import pytest

from serving.api.errors import ApiError
from serving.batch import jobs
from serving.batch.store import BatchStore

CHAT = "/v1/chat/completions"


def line(custom_id, url=CHAT, **extra):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    item = {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}
    return json.dumps(item)


def test_files_round_trip_and_delete(tmp_path):
    store = BatchStore(tmp_path)
    meta = {"id": "file-abc123", "purpose": "batch", "bytes": 3, "created_at": 1}
    store.put_file(meta, b"xyz")
    assert store.get_file("file-abc123") == meta
    assert store.file_content("file-abc123") == b"xyz"
    assert store.list_files() == [meta]
    store.delete_file("file-abc123")
    with pytest.raises(KeyError):
        store.get_file("file-abc123")


@pytest.mark.parametrize("bad", ["../etc/passwd", "file-../x", "file-", "batch_abc", "file-a/b"])
def test_ids_cannot_escape_the_store(tmp_path, bad):
    with pytest.raises(KeyError):
        BatchStore(tmp_path).get_file(bad)


def test_journal_keeps_first_answer_and_cuts_a_torn_tail(tmp_path):
    store = BatchStore(tmp_path)
    bid = "batch_abc"
    store.append_result(bid, {"index": 0, "v": 1})
    store.append_result(bid, {"index": 1, "v": 2})
    store.append_result(bid, {"index": 0, "v": 3})  # a duplicate never wins
    path = tmp_path / "batches" / f"{bid}.results.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"index": 2, "v"')  # the app died mid-write
    results = store.read_results(bid)
    assert {i: e["v"] for i, e in results.items()} == {0: 1, 1: 2}
    assert path.read_bytes().endswith(b"}\n")  # the torn line is gone from the file
    store.append_result(bid, {"index": 2, "v": 4})  # and the next append is a whole line
    assert store.read_results(bid)[2]["v"] == 4


def test_records_are_replaced_whole(tmp_path):
    store = BatchStore(tmp_path)
    store.save_batch({"batch": {"id": "batch_x1", "status": "in_progress"}, "lane": {}})
    store.save_batch({"batch": {"id": "batch_x1", "status": "completed"}, "lane": {}})
    assert [r["batch"]["status"] for r in store.load_batches()] == ["completed"]
    assert not list((tmp_path / "batches").glob(".*tmp"))


def test_parse_input_accepts_valid_lines():
    data = "\n".join([line("a"), line("b"), ""]).encode()
    lines, errors = jobs.parse_input(data, CHAT, 10)
    assert errors == [] and [x.custom_id for x in lines] == ["a", "b"]


@pytest.mark.parametrize(
    ("raw", "param", "fragment"),
    [
        ("not json", None, "not valid JSON"),
        (line("a", url="/v1/completions"), "url", "differs from the batch's endpoint"),
        (line("a", method="GET"), "method", "only 'POST'"),
        (line("a", extra=1), "extra", "unknown field"),
        (json.dumps({"custom_id": "", "method": "POST", "url": CHAT, "body": {}}), "custom_id", ""),
        (json.dumps({"custom_id": "z", "method": "POST", "url": CHAT, "body": {"stream": True}}),
         "body.stream", "not allowed"),
    ],
)  # fmt: skip
def test_parse_input_names_line_and_field(raw, param, fragment):
    data = "\n".join([line("ok"), raw]).encode()
    _, errors = jobs.parse_input(data, CHAT, 10)
    assert len(errors) == 1 and errors[0]["line"] == 2 and errors[0]["param"] == param
    assert fragment in errors[0]["message"]


def test_parse_input_refuses_duplicates_and_too_many_lines():
    _, errors = jobs.parse_input(f"{line('a')}\n{line('a')}".encode(), CHAT, 10)
    assert "not unique" in errors[0]["message"]
    _, errors = jobs.parse_input("\n".join(line(str(i)) for i in range(5)).encode(), CHAT, 4)
    assert errors[0]["code"] == "too_many_requests"
    _, errors = jobs.parse_input(b"\n\n", CHAT, 4)
    assert "no request lines" in errors[0]["message"]


def test_completion_window_forms_and_limit():
    assert jobs.window_seconds("24h", 86400) == 86400
    assert jobs.window_seconds("90s", 86400) == 90
    assert jobs.window_seconds("5m", 86400) == 300
    for bad in ("25h", "1d", "", 24, "0h"):
        with pytest.raises(ApiError) as err:
            jobs.window_seconds(bad, 86400)
        assert err.value.status == 400 and err.value.param == "completion_window"


def test_endpoints_refused_by_name():
    assert jobs.check_endpoint(CHAT, jobs.GENERATE_ENDPOINTS) == CHAT
    with pytest.raises(ApiError, match="embeddings need an embedding model"):
        jobs.check_endpoint("/v1/embeddings", jobs.GENERATE_ENDPOINTS)
    with pytest.raises(ApiError, match="not supported by this app"):
        jobs.check_endpoint("/v1/responses", jobs.GENERATE_ENDPOINTS)


def test_metadata_limits():
    assert jobs.check_metadata({"k": "v"}) == {"k": "v"}
    for bad in ({"k": 1}, {str(i): "v" for i in range(17)}, {"k" * 65: "v"}, "x"):
        with pytest.raises(ApiError):
            jobs.check_metadata(bad)


def test_output_files_split_successes_from_errors_in_input_order():
    a, b, c = (jobs.BatchLine(i, f"c{i}", {}) for i in range(3))
    entries = [
        jobs.result_entry(c, 200, {"usage": {"prompt_tokens": 2, "completion_tokens": 3}}),
        jobs.result_entry(a, 200, {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
        jobs.result_entry(b, 400, {"error": {"message": "bad"}}),
    ]
    out, err = jobs.output_files(entries)
    assert [json.loads(x)["custom_id"] for x in out.splitlines()] == ["c0", "c2"]
    assert [json.loads(x)["custom_id"] for x in err.splitlines()] == ["c1"]
    assert "index" not in json.loads(out.splitlines()[0])
    assert jobs.usage_of(entries)["total_tokens"] == 7
