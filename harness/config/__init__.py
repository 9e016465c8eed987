"""Configuration: the typed schemas, their composition by Hydra, and the checks a run passes before it writes anything."""
