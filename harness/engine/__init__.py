"""The hf backend's decode engine: shared-prefix prefill, batched decoding on preallocated KV buffers, attention and linear kernels (imports torch lazily through its users)."""
