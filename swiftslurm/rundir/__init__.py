"""The run directory: every file name (layout.py) and every record in it, written and read one way."""
