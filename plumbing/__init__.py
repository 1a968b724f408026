"""The plumbing a reader of the recipe may skip: tokenizers (tokenizer.py, gguf.py), hub access (hub.py),
the raven checkpoint format (raven.py), math answer grading (math_grader.py), the KV cache (kv_cache.py),
atomic run directories (checkpoint.py) and command-line helpers (cli.py)."""
