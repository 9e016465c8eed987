"""Measurement of a completion: its tool calls (toolcalls), its label (grading), the likelihood of its candidate actions (propensity), attention, cost and token counts."""
