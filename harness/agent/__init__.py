"""Rollouts: the model acts in an environment over several steps and turns (`experiment.mode=rollouts`)."""
