"""Versions of the libraries whose internals the probe engine relies on, checked before the engine is imported, and
the one place that reads accelerate's dispatch hooks (where a dispatched model's inputs go)."""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any

from probe.errors import ProbeError

# The transformers majors the engine is tested on; keep in step with `transformers>=5.0,<6` in pyproject.toml.
SUPPORTED_TRANSFORMERS_MAJORS: tuple[int, ...] = (5,)


class UnsupportedVersionError(ProbeError):
    """An installed library's version is outside the range the toolkit is tested on."""


def major_version(version: str) -> int:
    """The major number of a version string (``"5.24.0"`` -> 5, ``"6.0.0.dev0"`` -> 6).

    Raises:
        UnsupportedVersionError: the string does not start with a number.
    """
    m = re.match(r"\s*v?(\d+)", version)
    if m is None:
        raise UnsupportedVersionError(f"cannot read a major version from {version!r}")
    return int(m.group(1))


def check_transformers_version(installed: str | None = None) -> str:
    """Refuse a transformers major the probe engine is not tested on.

    Args:
        installed: the version to check; None reads the installed distribution's metadata (without importing
            transformers).

    Returns:
        The installed version string.

    Raises:
        UnsupportedVersionError: transformers is missing, or its major is not one of
            :data:`SUPPORTED_TRANSFORMERS_MAJORS` (the message names the installed and the supported versions and
            how to install a supported one).
    """
    supported = ", ".join(f"{m}.x" for m in SUPPORTED_TRANSFORMERS_MAJORS)
    pin = f"transformers>={min(SUPPORTED_TRANSFORMERS_MAJORS)}.0,<{max(SUPPORTED_TRANSFORMERS_MAJORS) + 1}"
    if installed is None:
        try:
            installed = metadata.version("transformers")
        except metadata.PackageNotFoundError:
            raise UnsupportedVersionError(
                f"the probe engine needs transformers {supported}, which is not installed: pip install '{pin}'"
            ) from None
    if major_version(installed) not in SUPPORTED_TRANSFORMERS_MAJORS:
        raise UnsupportedVersionError(
            f"transformers {installed} is installed, but the probe engine is tested on transformers {supported} only "
            f"(it relies on its attention-interface internals); install a supported version: pip install '{pin}'"
        )
    return installed


def input_device(model: Any) -> Any:
    """The device a model's input ids belong on: the execution device of its input embedding.

    A model dispatched by accelerate (``device_map``) may keep its first weights on the ``meta`` device (offloaded to
    CPU RAM or disk and loaded by hooks at each forward), so ``model.device`` (the first parameter's) is not a
    place for inputs; the embedding's hook names the device its forward runs on.

    Args:
        model: a transformers model, dispatched or not.

    Returns:
        A ``torch.device``.
    """
    import torch

    emb = model.get_input_embeddings()
    hook = getattr(emb, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is None:
        dev = next(iter(emb.parameters())).device
    if isinstance(dev, int):
        return torch.device("cuda", dev)
    dev = torch.device(dev)
    return torch.device("cpu") if dev.type == "meta" else dev


__all__ = ["SUPPORTED_TRANSFORMERS_MAJORS", "UnsupportedVersionError", "check_transformers_version", "input_device",
           "major_version"]
