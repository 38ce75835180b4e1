"""``loraplex qualify``: the seeds' qualification matrix judged against a running deployment, and
cost per request that used the correct revision (docs/qualification.md). Torch-free: a client of
the public and admin APIs, except where a plan asks it to start its own server."""
