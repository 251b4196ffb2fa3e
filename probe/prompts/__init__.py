"""Prompt building: Task + condition + load + replication -> Prompt (segments with spans) -> TokenizedPrompt
(docs/method.md#conditions)."""
