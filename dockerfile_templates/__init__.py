"""offline package."""
