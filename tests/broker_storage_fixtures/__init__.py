"""Helpers for the broker storage tests: record batches built exactly as kafka-python builds them."""
