"""Committed checkpoints: the manifest written last, the resume point, quarantine and retention."""
