"""Helpers for testing handlers without a server (shipped so users can test their model.py)."""
