"""The verl chapter's machinery."""
