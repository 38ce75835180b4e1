"""What every benchmark shares: a server process's lifecycle (launch, wait until it answers,
stop its process group, a free port, logs kept where the caller says), the machine record, the
ABBA run order, and failure-aware statistics with the undefined-ratio rule (null, never 0)."""
