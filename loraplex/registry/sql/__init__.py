"""The registry's database layer: one SQL schema, two engines (SQLite, PostgreSQL).

``db`` defines the small ``Database``/``Tx`` seam both engines implement; ``migrations`` owns the
schema; ``tenants``, ``adapters`` and ``audit`` map rows to the records in ``registry.models``.
Every function here takes an open ``Tx`` so callers compose one transaction per change.
"""
