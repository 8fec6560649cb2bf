"""Which vLLM releases kvpolicy-vllm was tested against, checked at startup."""

from __future__ import annotations

from kvpolicy.vllm._errors import UnsupportedVLLMError

__all__ = ["TESTED_VLLM_VERSIONS", "check_vllm_version"]

TESTED_VLLM_VERSIONS: tuple[str, ...] = ("0.32.0",)
"""vLLM releases whose internals the drift-guard tests pinned (see tests/test_drift.py)."""


def check_vllm_version(version: str | None = None, *, allow_untested: bool = False) -> str:
    """Return the vLLM version, or raise when it is not one this package was tested against.

    Args:
        version: the version to check (None: the installed ``vllm.__version__``).
        allow_untested: accept any version (the scheduler then relies on the drift guard's
            symbols being unchanged; set ``allow_untested_vllm`` in the config).

    Raises:
        UnsupportedVLLMError: vLLM is missing, or its version is not in
            :data:`TESTED_VLLM_VERSIONS` and ``allow_untested`` is False.
    """
    if version is None:
        try:
            import vllm
        except ImportError as exc:
            raise UnsupportedVLLMError(f"vLLM is not installed: {exc}") from exc
        version = str(vllm.__version__)
    if not isinstance(version, str):
        raise TypeError(f"'version' must be a str: {version!r}")
    if version not in TESTED_VLLM_VERSIONS and not allow_untested:
        tested = ", ".join(TESTED_VLLM_VERSIONS)
        raise UnsupportedVLLMError(
            f"vLLM {version} is untested with kvpolicy-vllm (tested: {tested}); "
            "pin one of those or set 'allow_untested_vllm': true in the kvpolicy config"
        )
    return version
