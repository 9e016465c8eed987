"""The run flow: the plan of samples, admission into a run directory, and the stages between generation and records."""
