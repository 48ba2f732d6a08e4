"""`feddg rehearse-network`: the consortium on separate network stacks of one machine (see ``command``)."""
