"""Where an adapter copy lives (torch-free): the tier ledger and budgets, eviction policies, warm
pins, load statistics, the load-pipeline protocol and the tiered cache (``residency.cache``).

The torch and disk I/O backends that move bytes between tiers are in ``loraplex.runtime``.
"""
