"""Operating runs that exist: status, logs, cancel, resume, plots, the goodput ledger, the storage CLI."""
