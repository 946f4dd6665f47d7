"""The speculative decoding engine: backend, loop, verification, statistics, adaptivity."""
