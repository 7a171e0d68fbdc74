"""The pre-launch checks: one `Check` per fact, gathered on every node of the allocation, judged by node 0."""
