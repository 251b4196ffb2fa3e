"""Run the conformance suite over every causal-LM model type of the installed transformers and write what it found:
probe/attention/architectures.json (read by the engine when it attaches: probe/attention/architecture.py) and
docs/architectures.md (the table users read before they download weights).

    python scripts/architectures.py                      # every type, both files (about 3 minutes on 2 cores)
    python scripts/architectures.py --types gpt_oss phi3 # those types only, printed; nothing written

Each type runs in a forked process with a time limit, so one that hangs or crashes is refused with that reason and
the others go on. tests/attention/conformance/test_conformance.py fails when either file disagrees with what the suite finds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TIME_LIMIT = 60.0  # seconds per type; the slowest verified type takes about 5


def _run_one(model_type: str, conn) -> None:  # type: ignore[no-untyped-def]
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    from tests.attention.conformance.checks import conform

    finding = conform(model_type)
    conn.send((finding.entry(), finding.errors))
    conn.close()


def run_suite(types: list[str], limit: float = TIME_LIMIT, progress: bool = True) -> dict[str, dict]:
    """Each type's table entry, every type in a forked process of its own (module docstring)."""
    import tests.attention.conformance.checks  # noqa: F401 - imported once, before the forks

    ctx = mp.get_context("fork")
    out: dict[str, dict] = {}
    for i, model_type in enumerate(types):
        started = time.monotonic()
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_run_one, args=(model_type, send))
        proc.start()
        send.close()
        entry = None
        if recv.poll(limit):
            try:
                entry, _ = recv.recv()
            except EOFError:
                entry = None
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        if entry is None:
            why = f"over {limit:.0f} s" if time.monotonic() - started >= limit else f"exit code {proc.exitcode}"
            entry = {"verified": [], "reason": f"the suite's tiny model did not finish its checks ({why})"}
        out[model_type] = entry
        if progress:
            state = "verified" if "reason" not in entry else "refused"
            print(f"[{i + 1}/{len(types)}] {model_type}: {state} ({time.monotonic() - started:.1f} s)"
                  + (f": {entry['reason']}" if "reason" in entry else f", max error {entry.get('max_error')}"),
                  file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="+", help="check these model types only and print the findings")
    parser.add_argument("--limit", type=float, default=TIME_LIMIT, help="seconds per type")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import transformers

    from probe.attention.architecture import TABLE
    from tests.attention.conformance.models import causal_lm_types
    from tests.attention.conformance.table import render_markdown

    if args.types:
        print(json.dumps(run_suite(args.types, args.limit), indent=2))
        return 0
    found = run_suite(causal_lm_types(), args.limit)
    table = {"transformers": transformers.__version__, "types": found}
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (ROOT / "docs" / "architectures.md").write_text(render_markdown(table), encoding="utf-8")
    n = sum("reason" not in e for e in found.values())
    print(f"{n} of {len(found)} causal-LM model types verified; wrote {TABLE.relative_to(ROOT)} and "
          "docs/architectures.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
