"""Reports and plots built from finished runs (imports matplotlib lazily)."""
