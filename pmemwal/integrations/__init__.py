"""Adapters that let other projects store their logs in pmemwal."""
