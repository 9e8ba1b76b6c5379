"""Hugging Face config.json files of the shipped models (JSON data, no code)."""
