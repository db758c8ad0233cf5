"""The engine of the LLM pipeline: plain Python, no Prefect import; every stage callable alone."""
__version__ = "0.1.0"
