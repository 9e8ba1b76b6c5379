"""GPU, system, calibration and runtime spec files (YAML data, no code)."""
