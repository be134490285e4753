"""slotshift's ground floor: the generated API (slotshift.v1), configuration, and the small
building blocks every service uses (clock, supervised tasks, apportioning, TLS, tracing). It
imports neither a service nor a tool (slotshift_tools); the import-linter contracts hold it so."""
