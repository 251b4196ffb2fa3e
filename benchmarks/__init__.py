"""Benchmarks that print ratios measured side by side in one run: batched generation and the probe's cost."""
