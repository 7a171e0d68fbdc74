"""Object storage: committed checkpoints uploaded in the background and restored before a resume."""
