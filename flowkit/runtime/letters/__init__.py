"""Dead letters: sending them so that one always fits, reading and replaying them."""
