"""Prompt building: Task + condition + load + replication -> Prompt (segments with spans) -> TokenizedPrompt.

- :mod:`probe.prompts.builder` — the ICE builder (conditions, loads, placement; docs/method.md#conditions).
- :mod:`probe.prompts.tokenize` — the chat-templated model input with exact token spans.
- :mod:`probe.prompts.distractors` / :mod:`probe.prompts.filler` — the extraneous and neutral-filler pools.
- :mod:`probe.prompts.similarity` — S_sim and the similarity used by stratified distractor draws
  (docs/method.md#task-similarity-s_sim).
"""
