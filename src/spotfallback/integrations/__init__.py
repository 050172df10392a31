"""Optional integrations with experiment trackers; each imports its tracker only when used."""
