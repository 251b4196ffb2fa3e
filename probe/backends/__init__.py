"""Generation backends: a local transformers model (with probes) or a served OpenAI-compatible endpoint."""
