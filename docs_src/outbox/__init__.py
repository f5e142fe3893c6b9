"""Examples of the docs page outbox."""
