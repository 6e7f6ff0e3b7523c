"""Adapters to training frameworks (each an optional extra)."""

__all__: list[str] = []
