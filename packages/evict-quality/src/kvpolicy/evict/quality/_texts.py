"""Texts for training and evaluation: real English that ships with Python or the machine.

Training and evaluation never share text: the predictors are fitted on license texts
from ``/usr/share/common-licenses`` (GPL-3 and the licenses that embed it excluded, as the
quality claims are measured on GPL-3) and evaluated on ``pydoc_data.topics``.
"""

from __future__ import annotations

import pathlib

__all__ = [
    "EVAL_TEXTS",
    "LICENSES_DIR",
    "TRAINING_LICENSES",
    "TUNING_TEXTS",
    "default_text",
    "eval_text",
    "gpl3_path",
    "training_texts",
]

LICENSES_DIR = pathlib.Path("/usr/share/common-licenses")
"""Debian's directory of common license texts."""

TRAINING_LICENSES = (
    "Apache-2.0",
    "Artistic",
    "BSD",
    "GFDL-1.3",
    "GPL-2",
    "LGPL-2.1",
    "MPL-2.0",
)
"""License files the predictors are trained on (GPL-3 and LGPL-3 are held out)."""


def default_text() -> str:
    """The default evaluation text: Python's pydoc topics (``pydoc_data.topics``), in key order."""
    return _topics(reverse=False)


EVAL_TEXTS: dict[str, str] = {
    "license": "/usr/share/common-licenses/GPL-3 (licence prose, Debian)",
    "code": "Lib/argparse.py of the running Python (source code)",
    "docs": "pydoc_data.topics of the running Python (technical documentation)",
}
"""The evaluation texts by name, one of each kind, and where each comes from."""


TUNING_TEXTS: dict[str, str] = {
    "tune-license": "/usr/share/common-licenses/GPL-2 (licence prose, Debian)",
    "tune-code": "Lib/typing.py of the running Python (source code)",
    "tune-docs": "pydoc_data.topics of the running Python, topics in reverse key order "
    "(technical documentation; its first 2,048 tokens share no topic with docs')",
}
"""Texts of the same three kinds for choosing a policy's parameters, disjoint from
:data:`EVAL_TEXTS`, so that the evaluation texts are not tuned on."""


def eval_text(name: str) -> tuple[str, str]:
    """``(text, source)`` of one of :data:`EVAL_TEXTS` or :data:`TUNING_TEXTS`.

    Raises:
        ValueError: unknown name (the message lists the known ones).
        FileNotFoundError: the file is not on this machine.
    """
    import argparse
    import typing

    if name in ("license", "tune-license"):
        path = gpl3_path() if name == "license" else LICENSES_DIR / "GPL-2"
        if not path.is_file():
            raise FileNotFoundError(f"'text' {name} needs {path} (Debian's common-licenses)")
        return path.read_text(errors="replace"), str(path)
    if name in ("code", "tune-code"):
        path = pathlib.Path(argparse.__file__ if name == "code" else typing.__file__)
        return path.read_text(errors="replace"), f"{path.name} of Python's standard library"
    if name == "docs":
        return default_text(), "pydoc_data.topics"
    if name == "tune-docs":
        return _topics(reverse=True), "pydoc_data.topics, reverse key order"
    known = ", ".join([*EVAL_TEXTS, *TUNING_TEXTS])
    raise ValueError(f"'text' must be one of {known}: {name!r}")


def _topics(*, reverse: bool) -> str:
    """Python's pydoc topics joined in key order (or its reverse)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics, reverse=reverse))


def gpl3_path() -> pathlib.Path:
    """Path of the GPL-3 text (exists on Debian-based machines)."""
    return LICENSES_DIR / "GPL-3"


def training_texts() -> list[str]:
    """The training license texts present on this machine.

    Raises:
        FileNotFoundError: none of :data:`TRAINING_LICENSES` is present.
    """
    texts = [
        (LICENSES_DIR / name).read_text(errors="replace")
        for name in TRAINING_LICENSES
        if (LICENSES_DIR / name).is_file()
    ]
    if not texts:
        raise FileNotFoundError(f"no training license text under {LICENSES_DIR}")
    return texts
