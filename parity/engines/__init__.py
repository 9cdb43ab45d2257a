"""Adapters that make other engines write the project's probe dumps (docs/engines.md)."""
