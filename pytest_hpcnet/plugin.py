"""pytest wiring (being assembled)."""
