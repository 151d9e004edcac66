"""Corral: a self-hosted runtime for LLM agents."""

__version__ = "0.1.0"
