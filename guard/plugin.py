"""pytest plugin (filled in below)."""
