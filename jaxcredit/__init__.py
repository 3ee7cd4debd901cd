"""jaxcredit: dense credit assignment for multi-turn tool-use LLM agents in JAX."""

__version__ = "0.1.0"
