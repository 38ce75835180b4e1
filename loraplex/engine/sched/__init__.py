"""The step planner (torch-free). ``sched.scheduler.Scheduler`` is the only entry point and the
only code that changes a request's state; its helpers are private to this package:
``fair_order`` (per-tenant queues and virtual time), ``admission`` (queue limits, class seat
caps, the cold-load quota and the lease window) and ``stats`` (the published queue view)."""
