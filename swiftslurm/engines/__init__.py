"""One adapter per training engine (engines/base.py): everything that differs between `swift` and `megatron`."""
