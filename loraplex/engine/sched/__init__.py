"""The step planner (torch-free). ``sched.scheduler.Scheduler`` is the only entry point and the
only code that changes a request's state; it is one class in three layers (``request_book``:
where each request is; ``planner``: each step's plan and its result; ``scheduler``: adapter
leases). Its helpers are private to this package: ``fair_order`` (per-tenant queues and virtual
time), ``admission`` (queue limits, class seat caps, the cold-load quota and the lease window),
``seats``, ``step_share`` and ``kv_shares`` (per-tenant shares), ``kept_kv`` (the KV sequences
paused requests keep) and ``stats`` (the published queue view)."""
