"""launchers."""
