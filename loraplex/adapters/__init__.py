"""Adapter artifacts: identity, manifest parsing and validation, tiers and the tiered cache.

NOTE: this package is imported by the torch-free control plane (registry); modules that need
torch import it themselves and are never imported from here.
"""
