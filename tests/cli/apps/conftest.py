"""The modules here are apps for the CLI tests to load, not tests: pytest leaves them alone."""

collect_ignore_glob = ["*.py"]
