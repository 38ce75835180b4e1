"""loraplex: serve one base LLM with thousands of LoRA adapters for many tenants."""

__version__ = "0.1.0"
