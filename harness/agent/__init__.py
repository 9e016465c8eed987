"""Environments a rollout acts in: a family's live simulator (`Environment`), and a frozen trajectory's one step
(`Frozen`): a single decision is the one-step case of the same loop (harness.flow.rounds)."""
