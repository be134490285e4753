"""slotshift's shared package: the generated API (slotshift.v1), configuration, and building blocks
every service uses. It imports none of the services; only slotshift.cli ties them together."""
