"""Analysis reads records only: it never needs the model to recompute a number or a figure."""
