"""Measurement of a completion: its label (grading), the likelihood of its candidate actions (propensity), attention, cost and token counts."""
