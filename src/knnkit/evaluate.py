"""Evaluation (placeholder)."""
