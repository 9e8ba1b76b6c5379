"""Cost model: per-op time (roofline with calibrated efficiencies), collectives, timeline, memory, energy."""
