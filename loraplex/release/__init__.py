"""Controlled releases: an alias moves to a new revision only after that revision proved itself.

A release is a persisted state machine (``model.ReleaseState``) driven by the serving process's
``controller``; operators start and steer it from the CLI or the admin API, which only write
the registry database. Torch-free.
"""
