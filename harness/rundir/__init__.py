"""A run directory: where its files live, the append-only record store with its writer lock, and the manifest."""
