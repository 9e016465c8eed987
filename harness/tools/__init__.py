"""Command-line tools beside the run: the benchmark and peer comparison, the template matrix, frozen datasets, the update-strategy table."""
