"""The Llama-family decoder (Llama, Mistral, Qwen2 layouts), its KV cache, sampler and offline
generation. Modules import torch themselves; this package file stays import-light.
"""
