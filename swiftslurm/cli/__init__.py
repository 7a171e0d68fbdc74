"""The command line itself: help, generated reference docs, and the user's own mistakes as one line each."""
