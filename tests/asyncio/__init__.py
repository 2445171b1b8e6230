"""AsyncRedlock: the same rules on the event loop."""
