"""The source article's flow: a completed lesson is recorded, its event applied once."""
