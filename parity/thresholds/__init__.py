"""Threshold files (TOML). A package so that installs ship ``default.toml`` as package data."""
