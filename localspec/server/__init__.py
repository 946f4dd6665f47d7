"""`localspec serve`: an OpenAI-compatible HTTP API with speculative statistics."""
