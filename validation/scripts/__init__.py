"""Scripts for GPU sessions (measurement and diagnosis)."""
