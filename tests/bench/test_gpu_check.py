"""``probe bench gpu-check``: its CPU mode runs every part on tiny models (so the GPU script cannot rot), and it
refuses clearly without CUDA."""

from __future__ import annotations

import pytest
import torch

from probe.bench.gpu_check import DeviceError, format_gpu_check, run_gpu_check
from probe.cli import main

pytestmark = pytest.mark.integration


def test_cpu_mode_runs_every_part() -> None:
    report = run_gpu_check(cpu=True)
    text = format_gpu_check(report)
    assert report.ok, text
    assert {r.dtype for r in report.exact} == {"float32", "bfloat16"}
    assert [r["n_tokens"] for r in report.bench] == [96, 160] and report.longest_probed == 160
    assert report.bench[0]["eager_s"] is not None  # eager fits at this size, so it is measured
    assert report.generation is not None and report.generation.same_tokens
    assert "PASSED" in text and "longest T probed" in text


def test_without_cuda_it_refuses_unless_cpu_mode_is_asked(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="no CUDA device"):
        run_gpu_check()
    assert main(["bench", "gpu-check"]) == 2
    assert "--cpu" in capsys.readouterr().err
