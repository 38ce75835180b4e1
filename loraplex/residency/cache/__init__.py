"""The tiered adapter cache: one unit that leases adapter copies to the engine and decides what
to load, keep and evict. ``TieredAdapterCache`` is the only entry point; its helpers are private
to this package."""
