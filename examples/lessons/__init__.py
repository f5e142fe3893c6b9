"""The lessons example: CompleteLesson publishes an event; a handler applies progress once."""
