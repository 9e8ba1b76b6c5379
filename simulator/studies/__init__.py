"""Studies: each a typed request -> typed result, built only on step costs (aisim.step) of a resolved Scenario.

single (one step), generate (prefill + decode steps), transcribe (whisper.cpp's phases), serve_bench (TGI's
benchmark layout), serve (request-level continuous batching). A study never re-resolves names and never calls
the public API.
"""
