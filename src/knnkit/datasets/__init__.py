"""Datasets (placeholder)."""
