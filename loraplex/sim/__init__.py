"""``loraplex sim``: a deterministic discrete-event simulator on a virtual clock that drives
loraplex's own torch-free decision code (scheduler, residency policies, router) with a cost model
for what it does not run (docs/simulator.md). Never imports torch."""
