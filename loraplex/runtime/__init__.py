"""The adapter runtime: the tier backends that move an adapter's bytes between the store (L3),
local disk (L2), pinned host memory (L1) and GPU slots (L0), with torch and disk I/O."""
