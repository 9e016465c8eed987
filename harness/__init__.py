"""statusbench: a research harness for context engineering in LLM agents.

Importing it stays cheap: torch, transformers, vllm and pandas are imported only where used.
"""
__version__ = "0.1.0"
