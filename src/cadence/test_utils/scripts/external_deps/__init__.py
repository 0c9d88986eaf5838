"""Bundled test scripts that need optional packages (or hardware); each says what it needs."""
