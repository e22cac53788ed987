"""Lightning callbacks, one per file."""
