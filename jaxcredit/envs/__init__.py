"""Tool-use environments. They know no model and no tokenizer: they work on text and chat messages.

- `calculator`: a safe evaluator of + - * / ( ) on integers and decimals (ast allow-list, never `eval`).
- `tool_calls`: the hermes/Qwen3 `<tool_call>` syntax, `<tool_response>` observations, `<answer>` tags.
- `arithmetic`: reasoning-gym arithmetic tasks, `ArithmeticEnv` (step/reward), warm-start demonstrations.

Submodules are imported on use; `arithmetic` imports reasoning-gym and math-verify lazily.
"""
