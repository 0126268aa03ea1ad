"""Apps for the CLI tests to load (each one is put on sys.path, not imported as a package)."""
