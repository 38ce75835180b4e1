"""Per-tenant request quotas: the ``max_requests_per_s`` token buckets, in this process or
shared through Redis by every ingress process. Torch-free, HTTP-free: ``server/limits.py`` calls
it and turns a refusal into a 429."""
