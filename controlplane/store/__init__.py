"""The control plane's state store: admin changes, version counters and decision history that
survive its restarts (base.py: the contract; sqlite.py, the default, and postgresql.py: the
implementations; opening.py: the one from the config)."""
