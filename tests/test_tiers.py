"""The unit tier is honest: a test without a model mark that loads a model fails, naming the mark to add
(tests/tiers.py); a test marked gpu is skipped without CUDA, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import tiers

ROOT = Path(__file__).resolve().parents[1]


def test_a_model_load_fails_inside_the_guard_and_works_again_outside(tmp_path: Path) -> None:
    import transformers

    import probe.loading

    transformers.LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1).save_pretrained(tmp_path)
    original = transformers.PreTrainedModel.__dict__["from_pretrained"], probe.loading.load_model
    with tiers.no_model_loads("tests/x.py::test_y"):
        expected = r"tests/x.py::test_y loads a model \(LlamaForCausalLM.from_pretrained\).*@pytest.mark.integration"
        with pytest.raises(pytest.fail.Exception, match=expected):
            try:
                transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
            except Exception:  # code under test that catches everything cannot hide the load
                pass
        with pytest.raises(pytest.fail.Exception, match=r"probe.loading.load_model"):
            probe.loading.load_model("smollm2-135m-instruct")
    assert (transformers.PreTrainedModel.__dict__["from_pretrained"], probe.loading.load_model) == original


def test_the_guard_applies_to_unmarked_tests_only_and_gpu_tests_skip_without_cuda(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_runtest_call, pytest_runtest_setup\n")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent('''
        import pytest
        import probe.loading

        ORIGINAL = probe.loading.load_model

        def test_unmarked_loads():
            probe.loading.load_model("smollm2-135m-instruct")

        @pytest.mark.integration
        def test_marked_may_load():
            assert probe.loading.load_model is ORIGINAL

        @pytest.mark.gpu
        def test_needs_cuda():
            pass
        '''))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nmarkers =\n    integration: x\n    gpu: x\n    slow: x\n    served: x\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-c", str(ini),
                          str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert "test_inner.py::test_unmarked_loads loads a model (probe.loading.load_model)" in text, text
    assert "1 failed, 1 passed" in text, text
    if not tiers.cuda_available():
        assert "needs a CUDA device" in text and "1 skipped" in text, text


def test_make_test_unit_selects_the_unit_tier() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ntest-unit:", 1)[1].split("\n\n", 1)[0]
    assert f'-m "{tiers.UNIT_MARKS}"' in recipe, recipe
