"""The node side: runs on every allocated node, reads plan.json, never imports Hydra."""
