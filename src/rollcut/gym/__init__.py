"""Runnable Gym servers built on rollcut's public APIs."""
