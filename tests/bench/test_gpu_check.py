"""``probe bench gpu-check`` (benchmarks/gpu_check.py): its CPU mode runs every part on tiny models (so the GPU script cannot rot), and it
refuses clearly without CUDA."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_check import DeviceError, format_gpu_check, run_gpu_check
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
    assert report.generation.forced_diff <= report.generation.tol and report.generation.forced_s > 0, text
    assert "PASSED" in text and "longest T probed" in text
    # part 4: every architecture of the CPU mode in both dtypes, raw and value-weighted rows held to the reference
    assert {(r.arch, r.dtype) for r in report.answer} == {(a, d) for a in ("llama", "gemma2", "gemma3")
                                                          for d in ("float32", "bfloat16")}
    assert all(0 < r.max_diff <= r.tol and r.max_vdiff <= r.tol for r in report.answer), text
    assert all(r.forced_diff <= r.tol for r in report.answer), text  # the two-stage probe of the same answers
    assert "4. attention while the answer is written" in text


def test_a_capture_that_drifts_from_its_reference_fails_the_check(monkeypatch) -> None:
    """The answer part compares with the reference: a capture whose masses are shifted fails it."""
    from probe.attention import decode
    from benchmarks import gpu_check

    real = decode.reference_answer_attention

    def shifted(model, tp, answer):  # noqa: ANN001, ANN202
        ref = real(model, tp, answer)
        ref.mass[..., 0] += 1e-3
        return ref

    monkeypatch.setattr(decode, "reference_answer_attention", shifted)
    rows = gpu_check.check_answer_capture(torch.device("cpu"), ("llama",), n_new=3)
    assert rows and not any(r.ok for r in rows if r.dtype == "float32")


def test_a_two_stage_probe_that_drifts_from_the_reference_fails_the_check(monkeypatch) -> None:
    """The two-stage column compares with the reference too: teacher-forced answer masses shifted by 1e-3 fail it."""
    from benchmarks import gpu_check

    real = gpu_check.probe_forced

    def shifted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = real(*args, **kwargs)
        for r in out:
            r.answer.mass[..., 0] += 1e-3
        return out

    monkeypatch.setattr(gpu_check, "probe_forced", shifted)
    rows = gpu_check.check_answer_capture(torch.device("cpu"), ("llama",), n_new=3)
    f32 = [r for r in rows if r.dtype == "float32"]
    assert f32 and all(r.max_diff <= r.tol for r in f32) and not any(r.ok for r in f32)


def test_without_cuda_it_refuses_unless_cpu_mode_is_asked(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="no CUDA device"):
        run_gpu_check()
    assert main(["bench", "gpu-check"]) == 2
    assert "--cpu" in capsys.readouterr().err
