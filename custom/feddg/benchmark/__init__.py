"""Leave-one-site-out benchmark helpers: paired statistics over per-case scores."""
