"""Rules of this category."""
